#!/usr/bin/env python3
"""Checks kiln-run's --stats-csv file against the overview it printed.

  check_stats_csv.py STATS.csv PROFILE.log [--allow-unnamed REGEX]

The header has every column; python's csv module reads every row; numbers
parse; there is one row per (kind, name); the row count is the "of N" of
the printed kernel stats; every generated kernel and GEMM names a model
line (but kernels whose symbol matches REGEX: compiler-made ones the
model file has no line for); rows are sorted by total time; shares of the
step are in [0, 1.05] (5%: the breakdown's own check), but collectives'
(two may run at once). Exits 1 with the first problem.
"""
import csv
import re
import sys

COLUMNS = ["kind", "name", "calls", "total_s", "mean_s", "step_share", "flops", "bytes",
           "gflops_per_s", "gbytes_per_s", "peak_share", "bound", "model_lines", "fused_ops"]


def main():
    path, log = sys.argv[1:3]
    unnamed = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--allow-unnamed" else None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != COLUMNS:
            print(f"FAIL: columns {reader.fieldnames}, expected {COLUMNS}")
            return 1
        rows = list(reader)
    m = re.search(r"kernel stats \(top \d+ of (\d+) by total time", open(log).read())
    if not m:
        print(f"FAIL: no kernel stats header in {log}")
        return 1
    if len(rows) != int(m.group(1)):
        print(f"FAIL: {len(rows)} rows, the overview says {m.group(1)}")
        return 1
    keys = [(r["kind"], r["name"]) for r in rows]
    if len(set(keys)) != len(keys):
        print("FAIL: a (kind, name) appears twice")
        return 1
    totals = []
    for r in rows:
        for c in ["calls", "total_s", "mean_s", "step_share", "flops", "bytes",
                  "gflops_per_s", "gbytes_per_s", "peak_share"]:
            float(r[c])
        if r["kind"] in ("kernel", "gemm") and not r["model_lines"] and not (
                unnamed and re.fullmatch(unnamed, r["name"])):
            print(f"FAIL: {r['kind']} {r['name']} names no model line")
            return 1
        # A collective's run time may pass the step: two can run at once
        # (a synchronous one on queue 0 beside an asynchronous one).
        if not 0 <= float(r["step_share"]) <= (1e9 if r["kind"] == "collective" else 1.05):
            print(f"FAIL: {r['name']}: step share {r['step_share']}")
            return 1
        totals.append(float(r["total_s"]))
    if totals != sorted(totals, reverse=True):
        print("FAIL: rows are not sorted by total time")
        return 1
    kinds = {r["kind"] for r in rows}
    print(f"PASS: {len(rows)} rows, kinds {sorted(kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
