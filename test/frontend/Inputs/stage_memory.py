#!/usr/bin/env python3
"""Compares per-stage arenas of two `kilnc --emit=plan` listings.

  stage_memory.py GPIPE_PLAN ONE_F_ONE_B_PLAN

Each listing has lines "  stage S (device...): arena N bytes ...". GPipe
holds every micro-batch's activations on every stage, 1F1B at most p - s,
so with M > p every stage's arena under GPipe must be larger. Prints both
and exits 1 otherwise.
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
if not g or g.keys() != f.keys():
    sys.exit("stage_memory.py: no matching stage lines in the two plans")
bad = 0
for s in sorted(g):
    ok = g[s] > f[s]
    bad |= not ok
    print(f"stage {s}: gpipe {g[s]} bytes, 1f1b {f[s]} bytes: {'gpipe above 1f1b' if ok else 'NOT ABOVE'}")
sys.exit(1 if bad else 0)
