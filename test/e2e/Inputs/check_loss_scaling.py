#!/usr/bin/env python3
"""Checks the loss scaler's progress lines against GradScaler's rules.

  check_loss_scaling.py OUT --init S --growth-interval N [--min-skipped K]

OUT holds `kiln-run train --log-interval 1` progress lines ("step 3/40 | loss
... | scale 1.37439e+11 skipped 3 | ..."). Per step: a step whose skipped
count went up must have halved the scale (backoff 0.5); any other step keeps
the scale, or doubles it after N clean steps in a row. Also: at least K steps
skipped, at least one applied, and the loss fell (mean of the last 5 steps
below the mean of the first 5 applied steps). Prints one summary line;
exits 1 on a violation.
"""
import argparse
import re
import sys

LINE = re.compile(r"step\s+(\d+)/\d+ \| loss ([-+0-9.naife]+) .*\| scale (\S+) skipped (\d+) \|")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--init", type=float, required=True)
    ap.add_argument("--growth-interval", type=int, required=True)
    ap.add_argument("--min-skipped", type=int, default=1)
    a = ap.parse_args()
    rows = [(int(m[1]), float(m[2]), float(m[3]), int(m[4]))
            for m in (LINE.search(l) for l in open(a.out)) if m]
    if not rows:
        print("FAIL: no progress lines with a scale in", a.out)
        return 1
    errors = []
    scale, skipped, good = a.init, 0, 0
    applied_losses = []
    for step, loss, s, k in rows:
        if k == skipped + 1:
            want, good = scale * 0.5, 0
        elif k == skipped:
            good += 1
            want = scale
            if good == a.growth_interval:
                want, good = scale * 2, 0
            applied_losses.append(loss)
        else:
            errors.append(f"step {step}: skipped went from {skipped} to {k} (one step at a time)")
            want = s
        # The printed scale has 6 significant digits.
        if abs(s - want) > 1e-5 * want:
            errors.append(f"step {step}: scale {s:g}, expected {want:g}")
        scale, skipped = want, k
    if skipped < a.min_skipped:
        errors.append(f"{skipped} steps skipped, expected at least {a.min_skipped}")
    if len(applied_losses) < 10:
        errors.append(f"only {len(applied_losses)} steps applied; need 10 to judge the loss")
    elif not sum(applied_losses[-5:]) < sum(applied_losses[:5]):
        errors.append("the loss did not fall over the applied steps: first 5 %s, last 5 %s"
                      % (applied_losses[:5], applied_losses[-5:]))
    for e in errors:
        print("BAD ", e)
    print(f"{'FAIL' if errors else 'PASS'}: {len(rows)} steps, {skipped} skipped, final scale "
          f"{scale:g}, loss {applied_losses[0] if applied_losses else float('nan'):.4f} -> "
          f"{applied_losses[-1] if applied_losses else float('nan'):.4f}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
