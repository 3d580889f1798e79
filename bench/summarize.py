#!/usr/bin/env python3
"""Summarizes bench/run.sh's rounds (see there): per-trainer medians over all
rounds, per-round speedups, and Kiln's profile grouped into GEMMs and the
rest."""
import json
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

# Where Kiln's time goes.
prof = open(f"{out}/profile.txt").read()
total = float(re.search(r"profile \(all entry points, ([0-9.]+) s in steps\)", prof).group(1))
byop = prof.split("by op:")[1]
gemm = sum(float(m) for m in re.findall(r"([0-9.]+) s\s+\d+ calls  gemm", byop))
kern = {op: float(s) for s, op in re.findall(r"([0-9.]+) s\s+\d+ calls  (kiln\.\w+|copy)", byop)}
print(f"Kiln's profile (50 steps, {total / 50 * 1e3:.1f} ms/step with timing on): "
      f"GEMMs {gemm / total * 100:.0f}% ({gemm / 50 * 1e3:.1f} ms/step), "
      f"generated kernels {sum(kern.values()) / total * 100:.0f}% ({sum(kern.values()) / 50 * 1e3:.1f} ms/step)")
top = sorted(kern.items(), key=lambda kv: -kv[1])[:6]
print("  kernels by main op (ms/step): " + ", ".join(f"{op} {s / 50 * 1e3:.2f}" for op, s in top))
gemms = re.findall(r"[0-9.]+%\s+([0-9.]+) s\s+(\d+) calls  (gemm [0-9x]+ [NT]{2})\s.*?(\d+) GFLOP/s", prof)
print("  GEMMs (ms/step, GFLOP/s): " + ", ".join(f"{name[5:]} {float(s) / 50 * 1e3:.2f} {g}"
                                                 for s, c, name, g in gemms[:6]))
