#!/usr/bin/env python3
"""Compares the first steps of two kiln-run --loss-log files ("step loss
[grad_norm]" per line): a device's run against a reference run of the same
artifact (same initial parameters, data windows and dropout masks).

  compare_losses.py REFERENCE.loss CANDIDATE.loss [--steps 5] [--rtol 2e-4]
                    [--ref-name cpu] [--name cuda]

Prints one line per step (both losses, their relative difference, and the
same for the gradient norm when both logs have it) and a verdict; exit 0
when every loss agrees within --rtol, 1 when one does not or a log has
fewer than --steps steps, 2 on unreadable input.

Tolerance. Both runs are fp32 from identical state; they differ only in
summation order (blocked GPU reductions and cuBLASLt tiling against the CPU
kernels' row loops and OpenBLAS) and in transcendental implementations
(CUDA's expf/logf/erff against libm, each within 2 ulp). On the first
step's loss that is ~1e-6 relative; the small differences in gradients then
move the parameters apart a little at every Adam step, ~1e-5 relative on the
loss by step 5. --rtol 2e-4 leaves an order of magnitude above that; a
real error (a wrong kernel, another dropout mask or data window, a broken
update) shows as 1e-3 and above, usually from step 1 or 2. The gradient
norm is printed for diagnosis and not judged: as a sum over every gradient
element it is more sensitive to the same rounding.
"""
import argparse
import sys


def read(path):
    rows = {}
    try:
        for line in open(path):
            p = line.split()
            if len(p) >= 2:
                rows[int(p[0])] = (float(p[1]), float(p[2]) if len(p) >= 3 else None)
    except (OSError, ValueError) as e:
        print(f"compare_losses.py: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    return rows


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rtol", type=float, default=2e-4)
    ap.add_argument("--ref-name", default="cpu")
    ap.add_argument("--name", default="cuda")
    a = ap.parse_args()
    ref, got = read(a.reference), read(a.candidate)
    steps = sorted(ref)[:a.steps]
    missing = [s for s in steps if s not in got]
    if len(steps) < a.steps or missing:
        print(f"compare: FAIL: need {a.steps} steps; {a.reference} has {len(ref)}, "
              f"{a.candidate} lacks steps {missing or '-'}")
        return 1
    print(f"{'step':>4} {'loss ' + a.ref_name:>14} {'loss ' + a.name:>14} {'rel diff':>9}"
          f" {'gnorm ' + a.ref_name:>14} {'gnorm ' + a.name:>14} {'rel diff':>9}")
    worst, worst_g = 0.0, 0.0
    for s in steps:
        (l0, g0), (l1, g1) = ref[s], got[s]
        d = rel(l1, l0)
        worst = max(worst, d)
        gtxt = ""
        if g0 is not None and g1 is not None:
            dg = rel(g1, g0)
            worst_g = max(worst_g, dg)
            gtxt = f" {g0:14.8f} {g1:14.8f} {dg:9.2e}"
        print(f"{s + 1:4d} {l0:14.8f} {l1:14.8f} {d:9.2e}{gtxt}")
    ok = worst <= a.rtol
    print(f"compare: {'PASS' if ok else 'FAIL'}: first {a.steps} losses of {a.name} vs "
          f"{a.ref_name}: worst relative difference {worst:.2e} (tolerance {a.rtol:g}); "
          f"gradient norm {worst_g:.2e} (not judged)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
