#!/usr/bin/env python3
"""Weights, data and a float64 reference for the three tutorial models of
examples/tutorials (docs/coming-from-pytorch.md; test/e2e/tutorials.test).
numpy only.

  tutorials.py setup MODEL OUTDIR [--rows N] [--seed S]
  tutorials.py check MODEL OUTDIR LOSSLOG --batch G [--steps N] [--rtol R]
      [--keras-adam]

MODEL is ddp_toy, keras_mirrored or model_parallel.

setup: OUTDIR/w.safetensors (seeded weights, PyTorch's default scale
uniform(+-1/sqrt(in)), biases nonzero) and OUTDIR/data/<input>.npy (N
rows). ddp_toy's file uses the names of the DDP tutorial's ToyModel
(net1.weight, net2.bias, ...), so kiln-run needs --init-rename; the other
two use Kiln's names.

check: trains the same model with the same optimizer in float64 from
OUTDIR/w.safetensors on the batches of a --in-order run with global batch
G (step i reads rows iG .. iG + G - 1, wrapping past the end), and
compares each step's loss with the kiln-run --loss-log LOSSLOG: the
relative difference must be at most R. --keras-adam uses Keras's Adam
(epsilon added to sqrt(v) before the bias correction) instead of the
PyTorch form Kiln implements, and prints the largest difference, for the
page's table; it does not fail.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# name: (layer widths, head, optimizer, layer names in the file,
#        input names); the Kiln parameters are linear, linear_1, ...
MODELS = {
    "ddp_toy": ([10, 50, 2], "mse", ("sgd", 1e-3), ["net1", "net2"], ("x", "targets")),
    "keras_mirrored": ([10, 50, 2], "probs", ("adam", 1e-3, 0.9, 0.999, 1e-7),
                       ["linear", "linear_1"], ("x", "labels")),
    "model_parallel": ([100, 1000, 1000, 10], "logits", ("sgd", 1e-2),
                       ["linear", "linear_1", "linear_2"], ("x", "labels")),
}


def write_safetensors(path, tensors):
    """Header length (u64 little-endian), the JSON header, the raw data."""
    header, data = {}, b""
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        assert h["dtype"] == "F32", h
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], "<f4").reshape(h["shape"])
    return out


def setup(a):
    widths, head, _, names, inputs = MODELS[a.model]
    rng = np.random.default_rng(a.seed)
    w = {}
    for name, i, o in zip(names, widths[:-1], widths[1:]):
        bound = 1 / np.sqrt(i)
        w[f"{name}.weight"] = rng.uniform(-bound, bound, (o, i)).astype(np.float32)
        w[f"{name}.bias"] = rng.uniform(-bound, bound, o).astype(np.float32)
    os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    write_safetensors(os.path.join(a.out, "w.safetensors"), w)
    x = rng.normal(size=(a.rows, widths[0])).astype(np.float32)
    if head == "mse":
        y = rng.normal(size=(a.rows, widths[-1])).astype(np.float32)
    else:
        y = rng.integers(0, widths[-1], a.rows).astype(np.int32)
    np.save(os.path.join(a.out, "data", inputs[0] + ".npy"), x)
    np.save(os.path.join(a.out, "data", inputs[1] + ".npy"), y)


def loss_and_grads(params, x, y, head):
    """Forward and backward of relu MLP + head, float64."""
    acts = [x]
    h = x
    for k, (W, b) in enumerate(params):
        z = h @ W.T + b
        h = np.maximum(z, 0) if k + 1 < len(params) else z
        acts.append(h)
    z, n = acts[-1], x.shape[0]
    if head == "mse":
        loss = np.mean((z - y) ** 2)
        dz = 2 * (z - y) / z.size
    else:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        if head == "logits":
            loss = -np.mean(np.log(p[rows, y]))
            dz = p.copy()
            dz[rows, y] -= 1
            dz /= n
        else:  # probabilities, Keras's clip to [1e-7, 1 - 1e-7]
            pc = np.clip(p, 1e-7, 1 - 1e-7)
            loss = -np.mean(np.log(pc[rows, y]))
            dp = np.zeros_like(p)
            inside = (p[rows, y] > 1e-7) & (p[rows, y] < 1 - 1e-7)
            dp[rows, y] = np.where(inside, -1 / (n * pc[rows, y]), 0)
            dz = p * (dp - (dp * p).sum(axis=1, keepdims=True))
    grads = [None] * len(params)
    for k in range(len(params) - 1, -1, -1):
        W, _ = params[k]
        grads[k] = (dz.T @ acts[k], dz.sum(axis=0))
        if k:
            dz = (dz @ W) * (acts[k] > 0)
    return loss, grads


def train(params, data, head, opt, steps, batch, keras_adam=False):
    x, y = data
    rows = x.shape[0]
    m1 = [[np.zeros_like(t) for t in layer] for layer in params]  # Adam's m
    m2 = [[np.zeros_like(t) for t in layer] for layer in params]  # Adam's v
    losses = []
    for s in range(steps):
        idx = np.arange(s * batch, (s + 1) * batch) % rows
        loss, grads = loss_and_grads(params, x[idx], y[idx], head)
        losses.append(loss)
        t = s + 1
        new = []
        for k, layer in enumerate(params):
            out = []
            for j, (p, g) in enumerate(zip(layer, grads[k])):
                if opt[0] == "sgd":
                    p = p - opt[1] * g
                else:
                    _, lr, b1, b2, eps = opt
                    m = m1[k][j] = b1 * m1[k][j] + (1 - b1) * g
                    v = m2[k][j] = b2 * m2[k][j] + (1 - b2) * g * g
                    if keras_adam:  # Keras: eps on sqrt(v), lr bias-corrected
                        alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                        p = p - alpha * m / (np.sqrt(v) + eps)
                    else:  # PyTorch's torch.optim.Adam, and Kiln's adam
                        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
                        p = p - lr * mhat / (np.sqrt(vhat) + eps)
                out.append(p)
            new.append(tuple(out))
        params = new
    return losses


def read_loss_log(path):
    """kiln-run --loss-log: one 'step loss ...' line per step."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0].isdigit():
                out.append(float(parts[1]))
    return out


def check(a):
    _, head, opt, names, inputs = MODELS[a.model]
    w = read_safetensors(os.path.join(a.out, "w.safetensors"))
    params = [(w[f"{n}.weight"].astype(np.float64), w[f"{n}.bias"].astype(np.float64))
              for n in names]
    d = os.path.join(a.out, "data")
    x = np.load(os.path.join(d, inputs[0] + ".npy")).astype(np.float64)
    y = np.load(os.path.join(d, inputs[1] + ".npy"))
    if head == "mse":
        y = y.astype(np.float64)
    kiln = read_loss_log(a.loss_log)
    steps = a.steps or len(kiln)
    if len(kiln) < steps:
        sys.exit(f"FAIL: {a.loss_log} has {len(kiln)} steps, expected {steps}")
    ref = train(params, (x, y), head, opt, steps, a.batch)
    worst = 0.0
    print(f"{'step':>4}  {'kiln (fp32)':>14}  {'numpy (fp64)':>18}  rel diff")
    for s in range(steps):
        rel = abs(kiln[s] - ref[s]) / abs(ref[s])
        worst = max(worst, rel)
        print(f"{s:4d}  {kiln[s]:14.8f}  {ref[s]:18.12f}  {rel:.2e}")
    if a.keras_adam:
        keras = train(params, (x, y), head, opt, steps, a.batch, keras_adam=True)
        diff = max(abs(k - r) / abs(r) for k, r in zip(keras, ref))
        print(f"Keras's Adam (epsilon hat) against PyTorch's: largest relative loss difference {diff:.2e}")
    if worst > a.rtol:
        sys.exit(f"FAIL: worst relative difference {worst:.2e} > {a.rtol:g}")
    print(f"PASS: worst relative difference {worst:.2e} <= {a.rtol:g}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup")
    s.add_argument("model", choices=MODELS)
    s.add_argument("out")
    s.add_argument("--rows", type=int, default=64)
    s.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("model", choices=MODELS)
    c.add_argument("out")
    c.add_argument("loss_log")
    c.add_argument("--batch", type=int, required=True)
    c.add_argument("--steps", type=int, default=0)
    c.add_argument("--rtol", type=float, default=1e-5)
    c.add_argument("--keras-adam", action="store_true")
    a = ap.parse_args()
    setup(a) if a.cmd == "setup" else check(a)


if __name__ == "__main__":
    main()
