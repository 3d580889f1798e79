#!/usr/bin/env python3
"""Compares a mixed-precision --export-reference directory with the fp32 one.

  compare_precision.py MIXED_DIR FP32_DIR --type bf16|fp16 --factor K

For every gradient (grad.*.npy) and the loss of each step: the relative
error max|a - b| / max|b|, in units of the low type's unit roundoff u
(bf16: 8 significant bits, u = 2^-8; fp16: 11 bits, u = 2^-11). Fails when
any error exceeds K u, and also when every error is exactly zero: then the
program did not run in the low type at all and the comparison proves
nothing.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mixed")
    ap.add_argument("fp32")
    ap.add_argument("--type", choices=sorted(UNIT_ROUNDOFF), required=True)
    ap.add_argument("--factor", type=float, required=True)
    args = ap.parse_args()
    u = UNIT_ROUNDOFF[args.type]
    errors = []
    files = sorted(glob.glob(os.path.join(args.fp32, "grad.*.npy")))
    if not files:
        print(f"FAIL: no grad.*.npy in {args.fp32}")
        return 1
    for fb in files:
        name = os.path.basename(fb)
        fa = os.path.join(args.mixed, name)
        if not os.path.exists(fa):
            print(f"FAIL: {name} missing from {args.mixed}")
            return 1
        a, b = np.load(fa).astype(np.float64), np.load(fb).astype(np.float64)
        errors.append((name, float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))))
    steps = []
    for d in (args.mixed, args.fp32):
        with open(os.path.join(d, "manifest.json")) as f:
            steps.append([s["loss"] for s in json.load(f)["steps"]])
    for i, (x, y) in enumerate(zip(*steps)):
        errors.append((f"loss step {i}", abs(x - y) / max(abs(y), 1e-30)))
    ok = True
    for name, e in errors:
        print(f"{name}: {e:.3e} = {e / u:.2f} u")
        ok &= e <= args.factor * u
    worst = max(e for _, e in errors)
    if worst == 0:
        print(f"FAIL: bit-identical to fp32: the program did not run in {args.type}")
        return 1
    print(("PASS" if ok else "FAIL") + f" worst {worst / u:.2f} u (limit {args.factor:g} u, u = {u:.3e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
