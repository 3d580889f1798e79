#!/usr/bin/env python3
"""The PyTorch side of docs/coming-from-pytorch.md: the three tutorial
models of this folder in PyTorch, trained from the same safetensors
weights on the same .npy files as kiln-run, with both loss sequences
printed side by side.

  compare.py init MODEL DIR [--rows N] [--seed S]
      PyTorch's model with PyTorch's own initialisation (seed S), saved
      as DIR/w.safetensors (its state_dict, PyTorch's names), and random
      data in DIR/data/<input>.npy (N rows); prints the kiln-run flags
      that map the names.
  compare.py train MODEL DIR --batch B [--ddp N] [--steps S | --epochs E]
          [--kiln LOSSLOG] [--rtol R]
      Train the PyTorch model from DIR/w.safetensors on DIR/data, B rows
      per process, in file order (the rows of kiln-run train --in-order),
      and print the loss of every step. --ddp N runs N processes with
      DistributedDataParallel (gloo, CPU) and a DistributedSampler; the
      loss printed is the mean over the processes, as kiln-run prints it.
      --kiln: print kiln-run's --loss-log beside it and exit 1 when a
      step's losses differ by more than R relative (default 1e-5).

MODEL is ddp_toy, keras_mirrored or model_parallel. keras_mirrored is
the Keras model written in PyTorch (softmax probabilities, Keras's clip,
torch.optim.Adam with Keras's epsilon 1e-7; the page says how Keras's own
Adam differs). Needs torch and numpy; safetensors files are read and
written here directly (an 8-byte header length, a JSON header, raw
little-endian data), so the safetensors package is not needed.
"""
import argparse
import json
import os
import socket
import struct
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class ToyModel(nn.Module):
    """The DDP tutorial's pattern: Linear, ReLU, Linear."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 50)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(50, 2)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class KerasModel(nn.Module):
    """Dense(50, relu), Dense(2, softmax): returns probabilities."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(10, 50)
        self.dense_1 = nn.Linear(50, 2)

    def forward(self, x):
        return F.softmax(self.dense_1(F.relu(self.dense(x))), dim=-1)


class ModelParallelMLP(nn.Module):
    """100 -> 1000 -> 1000 -> 10, one layer per device (all "cpu" here;
    ["cuda:0", "cuda:1", "cuda:2"] on three GPUs)."""

    def __init__(self, devices=("cpu", "cpu", "cpu")):
        super().__init__()
        self.devices = devices
        self.fc1 = nn.Linear(100, 1000).to(devices[0])
        self.fc2 = nn.Linear(1000, 1000).to(devices[1])
        self.fc3 = nn.Linear(1000, 10).to(devices[2])

    def forward(self, x):
        h = F.relu(self.fc1(x.to(self.devices[0])))
        h = F.relu(self.fc2(h.to(self.devices[1])))
        return self.fc3(h.to(self.devices[2]))


def keras_sparse_ce(p, labels):
    """Keras's SparseCategoricalCrossentropy() on probabilities."""
    eps = 1e-7
    return F.nll_loss(torch.log(p.clamp(eps, 1 - eps)), labels)


# model: (module, loss, optimizer, inputs, kiln-run --init-rename rules)
MODELS = {
    "ddp_toy": (ToyModel, nn.MSELoss(), lambda ps: torch.optim.SGD(ps, lr=0.001),
                ("x", "targets"), ["net1.=linear.", "net2.=linear_1."]),
    "keras_mirrored": (KerasModel, keras_sparse_ce,
                       lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-7),
                       ("x", "labels"), ["dense.=linear.", "dense_1.=linear_1."]),
    "model_parallel": (ModelParallelMLP, nn.CrossEntropyLoss(),
                       lambda ps: torch.optim.SGD(ps, lr=0.01), ("x", "labels"),
                       ["fc1.=linear.", "fc2.=linear_1.", "fc3.=linear_2."]),
}


# model: (input features, outputs or classes)
FEATURES = {"ddp_toy": (10, 2), "keras_mirrored": (10, 2), "model_parallel": (100, 10)}


def save_safetensors(path, state):
    header, blobs, offset = {}, [], 0
    for name, t in state.items():
        raw = t.detach().cpu().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for name, h in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__":
            a, b = h["data_offsets"]
            arr = np.frombuffer(raw[8 + n + a:8 + n + b], "<f4").reshape(h["shape"])
            out[name] = torch.from_numpy(arr.copy())
    return out


def init(a):
    make, _, _, inputs, renames = MODELS[a.model]
    torch.manual_seed(a.seed)
    model = make()
    os.makedirs(os.path.join(a.dir, "data"), exist_ok=True)
    save_safetensors(os.path.join(a.dir, "w.safetensors"), model.state_dict())
    g = torch.Generator().manual_seed(a.seed + 1)
    features, outputs = FEATURES[a.model]
    x = torch.randn(a.rows, features, generator=g)
    if a.model == "ddp_toy":  # regression targets
        y = torch.randn(a.rows, outputs, generator=g).numpy()
    else:  # class labels
        y = torch.randint(0, outputs, (a.rows,), generator=g).numpy().astype(np.int32)
    np.save(os.path.join(a.dir, "data", inputs[0] + ".npy"), x.numpy())
    np.save(os.path.join(a.dir, "data", inputs[1] + ".npy"), y)
    print(" ".join("--init-rename " + r for r in renames))


def read_kiln_log(path):
    with open(path) as f:
        return [float(line.split()[1]) for line in f if line.split()[:1] and line.split()[0].isdigit()]


def train_replica(rank, a, port, out):
    make, loss_fn, make_opt, inputs, _ = MODELS[a.model]
    torch.set_num_threads(1)
    if a.ddp > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.ddp)
    model = make()
    model.load_state_dict(load_safetensors(os.path.join(a.dir, "w.safetensors")))
    if a.ddp > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = make_opt(model.parameters())
    d = os.path.join(a.dir, "data")
    x = torch.from_numpy(np.load(os.path.join(d, inputs[0] + ".npy")))
    y = torch.from_numpy(np.load(os.path.join(d, inputs[1] + ".npy")))
    if y.dtype == torch.int32:
        y = y.long()
    data = torch.utils.data.TensorDataset(x, y)
    sampler = (torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
               if a.ddp > 1 else None)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, sampler=sampler,
                                         shuffle=False, drop_last=True)
    steps = a.steps or a.epochs * len(loader)
    losses, epoch = [], 0
    while len(losses) < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            shown = loss.detach().clone()
            if a.ddp > 1:  # the mean over the processes: the global batch's loss
                dist.all_reduce(shown)
                shown /= a.ddp
            losses.append(shown.item())
            if len(losses) == steps:
                break
        epoch += 1
    if a.ddp > 1:
        dist.destroy_process_group()
    if rank == 0:
        out.extend(losses)
        np.save(os.path.join(a.dir, "torch_losses.npy"), np.array(losses))


def train(a):
    losses = []
    if a.ddp > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # fork: the processes inherit the imported torch (spawn would import
        # it again in each, seconds apiece)
        torch.multiprocessing.start_processes(train_replica, args=(a, port, []), nprocs=a.ddp,
                                              start_method="fork")
        losses = list(np.load(os.path.join(a.dir, "torch_losses.npy")))
    else:
        train_replica(0, a, 0, losses)
    kiln = read_kiln_log(a.kiln) if a.kiln else []
    worst = 0.0
    print(f"{'step':>4}  {'PyTorch':>12}" + (f"  {'Kiln':>12}  rel diff" if kiln else ""))
    for s, t in enumerate(losses):
        line = f"{s:4d}  {t:12.8f}"
        if s < len(kiln):
            rel = abs(kiln[s] - t) / abs(t)
            worst = max(worst, rel)
            line += f"  {kiln[s]:12.8f}  {rel:.1e}"
        print(line)
    if kiln:
        if len(kiln) != len(losses):
            sys.exit(f"FAIL: {len(kiln)} Kiln steps, {len(losses)} PyTorch steps")
        verdict = "PASS" if worst <= a.rtol else "FAIL"
        print(f"{verdict}: largest relative difference {worst:.1e} (tolerance {a.rtol:g})")
        if verdict == "FAIL":
            sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("model", choices=MODELS)
    i.add_argument("dir")
    i.add_argument("--rows", type=int, default=100)
    i.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("model", choices=MODELS)
    t.add_argument("dir")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--ddp", type=int, default=1)
    t.add_argument("--steps", type=int, default=0)
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--kiln")
    t.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    init(a) if a.cmd == "init" else train(a)


if __name__ == "__main__":
    main()
