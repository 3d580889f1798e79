"""Compares the validation lines two `kiln-run train` runs printed.

usage: compare_val.py A B ABS

Each file holds lines "step N: val loss X[, accuracy Y%] (K batches)". The
runs must evaluate at the same steps, with losses within ABS of each other
(they are printed with 4 decimals: ABS covers that rounding plus float32
summation order) and the same accuracy (counts of rows, printed exactly).
"""
import re
import sys

LINE = re.compile(r"step\s+(\d+): val loss ([-0-9.naif]+)(?:, accuracy ([0-9.]+)%)?")


def read(path):
    rows = []
    for line in open(path):
        m = LINE.search(line)
        if m:
            rows.append((int(m.group(1)), float(m.group(2)), m.group(3)))
    return rows


a, b, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
if not a or len(a) != len(b):
    sys.exit(f"compare_val: {len(a)} validation lines in {sys.argv[1]}, {len(b)} in {sys.argv[2]}")
for (sa, la, aa), (sb, lb, ab) in zip(a, b):
    if sa != sb:
        sys.exit(f"compare_val: evaluated at step {sa} against step {sb}")
    if not abs(la - lb) <= tol:
        sys.exit(f"compare_val: step {sa}: val loss {la} against {lb} (more than {tol} apart)")
    if aa != ab:
        sys.exit(f"compare_val: step {sa}: accuracy {aa}% against {ab}%")
print(f"compare_val: {len(a)} evaluations agree within {tol}")
