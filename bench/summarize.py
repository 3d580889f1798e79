#!/usr/bin/env python3
"""Summarizes bench/run.sh's rounds (see there): per-trainer medians over all
rounds, per-round speedups, and Kiln's profile grouped into GEMMs and the
rest."""
import json
import csv
import re
import statistics
import sys

out, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])


def kiln_round(r):
    ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(f"{out}/kiln.{r}.log").read())][10:]
    losses = [float(line.split()[1]) for line in open(f"{out}/kiln.{r}.loss")]
    return ms, losses


rows = {}
per_round = {"kiln": [], "torch": [], "jax": []}
all_ms = {"kiln": [], "torch": [], "jax": []}
loss = {}
for r in range(1, rounds + 1):
    ms, losses = kiln_round(r)
    all_ms["kiln"] += ms
    per_round["kiln"].append(statistics.median(ms))
    loss["kiln"] = (losses[0], sum(losses[-10:]) / 10)
    for fw in ("torch", "jax"):
        j = json.load(open(f"{out}/{fw}.{r}.json"))
        per_round[fw].append(j["median_ms"])
        all_ms[fw] += [j["median_ms"]]  # the peers report medians only
        loss[fw] = (j["first_loss"], j["last10_loss"])

steps = len(kiln_round(1)[1])
print(f"nanoGPT CPU config, {steps} steps x {rounds} rounds, {threads} thread(s), batch 12 x 64 tokens")
print(f"{'':8} {'median ms/step':>15} {'rounds (median each)':>26} {'tokens/s':>9} "
      f"{'loss step0':>11} {'loss last10':>12} {'Kiln speedup':>13} {'per round':>14}")
kiln = statistics.median(per_round["kiln"])
for fw in ("kiln", "torch", "jax"):
    med = statistics.median(per_round[fw])
    rs = " ".join(f"{x:.1f}" for x in per_round[fw])
    ratios = [p / k for p, k in zip(per_round[fw], per_round["kiln"])]
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}x" if fw != "kiln" else ""
    print(f"{fw:8} {med:15.1f} {rs:>26} {768 / med * 1e3:9.0f} {loss[fw][0]:11.3f} "
          f"{loss[fw][1]:12.3f} {med / kiln:12.2f}x {spread:>14}")
q = statistics.quantiles(all_ms["kiln"], n=10)
print(f"Kiln's steps over all rounds: p10 {q[0]:.1f}, median {statistics.median(all_ms['kiln']):.1f}, "
      f"p90 {q[-1]:.1f} ms")

# Where Kiln's time goes: the overview's breakdown (profile.txt) and its
# kernel stats (stats.csv, kiln-run --stats-csv; docs/profiling.md).
prof = open(f"{out}/profile.txt").read()
steps = int(re.search(r"profile of steps \d+\.\.\d+ \((\d+) steps", prof).group(1))
step_ms = float(re.search(r"of the measured ([0-9.]+) ms/step", prof).group(1))
rows = list(csv.DictReader(open(f"{out}/stats.csv", newline="")))
gemm = sum(float(r["total_s"]) for r in rows if r["kind"] == "gemm") / steps * 1e3
kern = {}
for r in rows:
    if r["kind"] in ("kernel", "copy"):
        op = r["fused_ops"].split(";")[-1] or r["kind"]
        kern[op] = kern.get(op, 0) + float(r["total_s"]) / steps * 1e3
print(f"Kiln's profile ({steps} steps, {step_ms:.1f} ms/step with timing on): "
      f"GEMMs {gemm / step_ms * 100:.0f}% ({gemm:.1f} ms/step), "
      f"generated kernels {sum(kern.values()) / step_ms * 100:.0f}% ({sum(kern.values()):.1f} ms/step)")
top = sorted(kern.items(), key=lambda kv: -kv[1])[:6]
print("  kernels by main op (ms/step): " + ", ".join(f"{op} {ms:.2f}" for op, ms in top))
gemms = [r for r in rows if r["kind"] == "gemm"][:6]
print("  GEMMs (ms/step, GFLOP/s): " + ", ".join(
    f"{r['name'][5:]} {float(r['total_s']) / steps * 1e3:.2f} {float(r['gflops_per_s']):.0f}"
    for r in gemms))
print("  " + re.search(r"^recommendation: .*$", prof, re.M).group(0))
