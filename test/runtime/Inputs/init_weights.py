#!/usr/bin/env python3
"""Weights for `kiln-run train --init` (test/runtime/init-weights.test),
written as safetensors by hand (numpy only), and the loss they give.

  init_weights.py write OUT.safetensors [--hidden H] [--seed S]
      [--dtype f32|f64|f16|bf16] [--torch] [--drop NAME] [--extra NAME]
      [--transpose NAME]
  init_weights.py loss W.safetensors DATADIR ROWS [--torch] LOSSLOG TOL

write: every parameter of the MLP example (examples/mlp.kiln, 64 features,
H hidden units, 10 classes) with seeded values, biases nonzero too, in
Kiln's names (dense.linear.weight, ...) or, with --torch, in the names
PyTorch's nn.Sequential(Linear, ReLU, Linear, ReLU, Linear).state_dict()
gives (0.weight, 0.bias, 2.weight, ...). Weights are [out, in], as both
nn.Linear and Kiln's linear store them. --drop leaves a tensor out,
--extra adds one, --transpose stores one transposed: the error cases.

loss: the MLP's forward in float64 on the first ROWS rows of DATADIR
(x.npy, labels.npy; the first batch of a run with --in-order) with the
weights of W, the mean cross-entropy, compared with step 0 of a
kiln-run --loss-log: the relative difference must be at most TOL.
"""
import argparse
import json
import struct
import sys

import numpy as np

KILN = ["dense.linear", "dense_1.linear", "linear"]
TORCH = ["0", "2", "4"]


def shapes(hidden):
    dims = [(hidden, 64), (hidden, hidden), (10, hidden)]
    out = {}
    for layer, (o, i) in enumerate(dims):
        out[f"{layer}.weight"] = (o, i)
        out[f"{layer}.bias"] = (o,)
    return out


def named(key, torch):
    layer, what = key.split(".")
    return f"{(TORCH if torch else KILN)[int(layer)]}.{what}"


def write_safetensors(path, tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, arr) in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    kinds = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        chunk = raw[8 + n + b:8 + n + end]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(chunk, np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(chunk, kinds[e["dtype"]])
        out[name] = arr.astype(np.float64).reshape(e["shape"])
    return out


def write(a):
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for key, shape in shapes(a.hidden).items():
        fan_in = shape[-1] if len(shape) == 2 else 64
        v = rng.uniform(-1, 1, size=shape) / np.sqrt(fan_in)
        if len(shape) == 1:
            v = v + 0.05  # biases nonzero, away from the artifact's zeros
        name = named(key, a.torch)
        if name == a.transpose:
            v = v.T
        if name == a.drop:
            continue
        if a.dtype == "f32":
            tensors[name] = ("F32", np.ascontiguousarray(v, np.float32))
        elif a.dtype == "f64":
            tensors[name] = ("F64", np.ascontiguousarray(v, np.float64))
        elif a.dtype == "f16":
            tensors[name] = ("F16", np.ascontiguousarray(v, np.float16))
        else:  # bf16: float32's upper half, rounded to nearest even
            bits = np.ascontiguousarray(v, np.float32).view(np.uint32)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            tensors[name] = ("BF16", bits.astype(np.uint16))
    if a.extra:
        tensors[a.extra] = ("F32", np.ones(3, np.float32))
    write_safetensors(a.out, tensors, {"format": "pt"})


def loss(a):
    w = read_safetensors(a.weights)
    x = np.load(f"{a.data}/x.npy")[:a.rows].astype(np.float64)
    labels = np.load(f"{a.data}/labels.npy")[:a.rows]
    names = TORCH if a.torch else KILN
    h = x
    for layer, prefix in enumerate(names):
        h = h @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]
        if layer < 2:
            h = np.maximum(h, 0)
    h = h - h.max(axis=1, keepdims=True)
    logp = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
    want = float(-logp[np.arange(a.rows), labels].mean())
    got = float(open(a.log).read().split("\n")[0].split()[1])
    rel = abs(got - want) / abs(want)
    print(f"step 0 loss: kiln-run {got:.9g}, numpy {want:.9g}, relative difference {rel:.2e}")
    if rel > a.tol:
        print(f"FAIL: above {a.tol}")
        sys.exit(1)
    print("OK")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--hidden", type=int, default=256)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--dtype", default="f32", choices=["f32", "f64", "f16", "bf16"])
    w.add_argument("--torch", action="store_true")
    w.add_argument("--drop")
    w.add_argument("--extra")
    w.add_argument("--transpose")
    l = sub.add_parser("loss")
    l.add_argument("weights")
    l.add_argument("data")
    l.add_argument("rows", type=int)
    l.add_argument("log")
    l.add_argument("tol", type=float)
    l.add_argument("--torch", action="store_true")
    a = ap.parse_args()
    write(a) if a.cmd == "write" else loss(a)


if __name__ == "__main__":
    main()
