#!/usr/bin/env python3
"""Compares two --export-reference directories tensor by tensor.

  compare_npy.py DIR_A DIR_B --prefix final. --rtol 1e-5 [--exact]

Relative error per tensor: max|a - b| / max(max|b|, 1e-30). Prints one line
per tensor and PASS/FAIL; exits 1 on a failure or a missing tensor.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--prefix", default="final.")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--exact", action="store_true", help="require identical bits")
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.a, args.prefix + "*.npy")))
    if not files:
        print(f"FAIL: no {args.prefix}*.npy in {args.a}")
        return 1
    worst, ok = 0.0, True
    for fa in files:
        name = os.path.basename(fa)
        fb = os.path.join(args.b, name)
        if not os.path.exists(fb):
            print(f"FAIL: {name} missing from {args.b}")
            return 1
        a, b = np.load(fa), np.load(fb)
        if a.shape != b.shape:
            print(f"FAIL: {name} shapes {a.shape} vs {b.shape}")
            return 1
        if args.exact:
            same = a.tobytes() == b.tobytes()
            print(f"{name} {'identical' if same else 'DIFFERENT'}")
            ok &= same
            continue
        rel = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
        worst = max(worst, rel)
        print(f"{name} rel {rel:.3e}")
        ok &= rel <= args.rtol
    for d in (args.a, args.b):
        with open(os.path.join(d, "manifest.json")) as f:
            json.load(f)
    la = [s["loss"] for s in json.load(open(os.path.join(args.a, "manifest.json")))["steps"]]
    lb = [s["loss"] for s in json.load(open(os.path.join(args.b, "manifest.json")))["steps"]]
    for i, (x, y) in enumerate(zip(la, lb)):
        rel = abs(x - y) / max(abs(y), 1e-30)
        print(f"step {i} loss {x:.7f} vs {y:.7f} rel {rel:.3e}")
        ok &= (x == y) if args.exact else rel <= args.rtol
    print(("PASS" if ok else "FAIL") + (f" worst {worst:.3e}" if not args.exact else " bit-identical" if ok else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
