#!/usr/bin/env python3
"""Compares two runs' losses step by step.

  compare_losses.py REF.log GOT.log N TOL        (kiln-run --loss-log files)
  compare_losses.py --eval REF.txt GOT.txt N TOL (kiln-run eval outputs)

Each of the N losses of GOT must be within TOL of REF, relative to REF's
magnitude; both files must hold exactly N losses. Prints every pair and the
worst difference; exits 1 on any violation.
"""
import re
import sys


def losses(path, is_eval):
    text = open(path).read()
    if is_eval:
        return [float(x) for x in re.findall(r"loss ([0-9.eE+-]+)", text)]
    return [float(line.split()[1]) for line in text.splitlines() if line.strip()]


def main():
    args = sys.argv[1:]
    is_eval = args[0] == "--eval"
    if is_eval:
        args = args[1:]
    ref_path, got_path, n, tol = args[0], args[1], int(args[2]), float(args[3])
    ref, got = losses(ref_path, is_eval), losses(got_path, is_eval)
    if len(ref) != n or len(got) != n:
        print(f"FAIL: expected {n} losses, found {len(ref)} in {ref_path} and {len(got)} in {got_path}")
        return 1
    worst = 0.0
    for i, (r, g) in enumerate(zip(ref, got)):
        rel = abs(r - g) / max(abs(r), 1e-30)
        worst = max(worst, rel)
        print(f"{'ok  ' if rel <= tol else 'BAD '} {i}: {r:.7f} {g:.7f} (relative {rel:.2e})")
    ok = worst <= tol
    print(f"{'PASS' if ok else 'FAIL'}: worst relative difference {worst:.2e} (tolerance {tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
