#!/usr/bin/env python3
"""Compares two Kiln checkpoints (safetensors) tensor by tensor.

  compare_checkpoints.py A.ckpt B.ckpt [--rtol R] [--atol A] [--exact]

A tensor passes when max|a - b| <= atol + rtol * max|b| (the relative error
is taken against the tensor's largest magnitude, so near-zero elements of a
large tensor do not dominate). --exact requires identical bits. Prints one
line per tensor, then PASS or FAIL; exits 1 on a failure, a missing tensor
or a shape mismatch. Metadata (step, data position) is not compared.
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
          "I32": np.int32, "I64": np.int64, "BF16": np.uint16, "U8": np.uint8}


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        a = np.frombuffer(b[8 + n + lo:8 + n + hi], DTYPES[t["dtype"]])
        out[name] = a.reshape(t["shape"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--atol", type=float, default=0.0)
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    ok = True
    if set(a) != set(b):
        print("FAIL: tensors differ: only in A: %s; only in B: %s"
              % (sorted(set(a) - set(b)), sorted(set(b) - set(a))))
        return 1
    worst = 0.0
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape:
            print(f"FAIL: {name}: shapes {x.shape} vs {y.shape}")
            return 1
        if args.exact:
            same = x.tobytes() == y.tobytes()
            print(f"{name}: {'identical' if same else 'DIFFERENT bits'}")
            ok &= same
            continue
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        diff = float(np.max(np.abs(xf - yf))) if x.size else 0.0
        scale = float(np.max(np.abs(yf))) if y.size else 0.0
        bound = args.atol + args.rtol * scale
        rel = diff / max(scale, 1e-30)
        worst = max(worst, rel)
        good = diff <= bound and np.all(np.isfinite(xf))
        print(f"{name}: max abs diff {diff:.3e}, relative {rel:.3e}{'' if good else '  FAIL'}")
        ok &= bool(good)
    print(("PASS" if ok else "FAIL") + ("" if args.exact else f" (worst relative {worst:.3e})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
