#!/usr/bin/env python3
"""Compares the tensors of two checkpoints (safetensors) element by element.

  compare_checkpoints.py REF GOT RTOL ATOL [--prefix P]

Every float tensor of REF (whose name starts with P, default all) must be
in GOT with the same shape, each element within ATOL + RTOL * |ref|; integer
tensors must be equal. Prints the worst tensor; exits 1 on any violation.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
          "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if t["dtype"] == "BF16":
            raw = np.frombuffer(body[lo:hi], dtype=np.uint16).astype(np.uint32) << 16
            a = raw.view(np.float32)
        else:
            a = np.frombuffer(body[lo:hi], dtype=DTYPES[t["dtype"]])
        out[name] = a.reshape(t["shape"])
    return out


def main():
    args = sys.argv[1:]
    prefix = ""
    if "--prefix" in args:
        i = args.index("--prefix")
        prefix = args[i + 1]
        del args[i:i + 2]
    ref, got = load(args[0]), load(args[1])
    rtol, atol = float(args[2]), float(args[3])
    worst, worst_name, bad = 0.0, "", 0
    for name, r in sorted(ref.items()):
        if not name.startswith(prefix):
            continue
        if name not in got:
            print(f"FAIL: {name} missing from {args[1]}")
            return 1
        g = got[name]
        if g.shape != r.shape:
            print(f"FAIL: {name}: shape {g.shape}, expected {r.shape}")
            return 1
        if not np.issubdtype(r.dtype, np.floating):
            if not np.array_equal(r, g):
                print(f"BAD  {name}: integers differ")
                bad += 1
            continue
        r64, g64 = r.astype(np.float64), g.astype(np.float64)
        excess = np.abs(g64 - r64) - (atol + rtol * np.abs(r64))
        e = float(excess.max()) if excess.size else -1.0
        rel = float((np.abs(g64 - r64) / np.maximum(np.abs(r64), 1e-30)).max()) if r.size else 0
        if e > 0:
            bad += 1
            print(f"BAD  {name}: worst excess {e:.3e} over atol {atol:g} + rtol {rtol:g} |ref|")
        if rel > worst:
            worst, worst_name = rel, name
    print(f"{'PASS' if not bad else 'FAIL'}: {len(ref)} tensors, worst relative difference "
          f"{worst:.2e} in {worst_name or '-'} (rtol {rtol:g}, atol {atol:g})")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
