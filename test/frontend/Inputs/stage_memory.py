#!/usr/bin/env python3
"""Compares per-stage arenas of two `kilnc --emit=plan` listings.

  stage_memory.py HIGH_PLAN LOW_PLAN [HIGH_NAME LOW_NAME]

Each listing has lines "  stage S (device...): arena N bytes ...". The
first schedule must need more on every stage: GPipe holds every
micro-batch's activations on every stage, 1F1B at most p - s, interleaved
1F1B in between (its warm-up runs more chunk forwards). Names default to
gpipe and 1f1b. Prints both and exits 1 otherwise.
"""
import re
import sys


def arenas(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s+stage (\d+) \(devices? [\d,]+\): arena (\d+) bytes", line)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


g, f = arenas(sys.argv[1]), arenas(sys.argv[2])
hi, lo = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("gpipe", "1f1b")
if not g or g.keys() != f.keys():
    sys.exit("stage_memory.py: no matching stage lines in the two plans")
bad = 0
for s in sorted(g):
    ok = g[s] > f[s]
    bad |= not ok
    print(f"stage {s}: {hi} {g[s]} bytes, {lo} {f[s]} bytes: {hi + ' above ' + lo if ok else 'NOT ABOVE'}")
sys.exit(1 if bad else 0)
