#!/usr/bin/env python3
"""Summarizes bench/mixed.sh's rounds (see there): per trainer the median
ms/step (median of the rounds' medians), the two ratios the mixed-precision
issue sets targets for, and the loss curves' mean |difference| per step.

  mixed_summary.py OUTDIR --threads N --rounds N --steps N --curve-steps N
                   [--attention sdpa] [--json FILE]

OUTDIR holds kiln-<p>.<r>.log/.loss (kiln-run train --log-interval 1) and
<fw>-<p>.<r>.json/.loss (bench/gpt_mixed.py) for p in fp32, bf16 and fw in
torch, torch-compile; a missing Kiln bf16 (kilnc without --precision) is
reported, not an error.
"""
import argparse
import json
import os
import re
import statistics
import sys

KILN_WARMUP = 10
TRAINERS = [("kiln", "fp32", "Kiln fp32"), ("kiln", "bf16", "Kiln bf16"),
            ("torch", "fp32", "PyTorch fp32 eager"), ("torch", "bf16", "PyTorch bf16 eager (autocast)"),
            ("torch-compile", "fp32", "PyTorch fp32 compile"),
            ("torch-compile", "bf16", "PyTorch bf16 compile (autocast)")]


def losses(path):
    return [float(line.split()[1]) for line in open(path) if line.strip()]


def p10(ms):
    return statistics.quantiles(ms, n=10, method="inclusive")[0] if len(ms) > 1 else ms[0]


def kiln_ms(path):
    """(median, p10) of the timed steps' ms/step in a --log-interval 1 log."""
    ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(path).read())][KILN_WARMUP:]
    return statistics.median(ms), p10(ms)


def mean_abs_diff(a, b, n):
    n = min(n, len(a), len(b))
    return sum(abs(x - y) for x, y in zip(a[:n], b[:n])) / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--curve-steps", type=int, required=True)
    ap.add_argument("--attention", default="sdpa")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    o = a.out
    rows = {}
    for fw, p, name in TRAINERS:
        per_round, p10s, curve, last10 = [], [], None, []
        for r in range(1, a.rounds + 1):
            if fw == "kiln":
                log = f"{o}/kiln-{p}.{r}.log"
                if not os.path.exists(log):
                    break
                med, low = kiln_ms(log)
                per_round.append(med)
                p10s.append(low)
            else:
                try:
                    j = json.load(open(f"{o}/{fw}-{p}.{r}.json"))
                    per_round.append(j["median_ms"])
                    p10s.append(j["p10_ms"])
                except (OSError, ValueError, KeyError):
                    per_round = []  # a failed run (bench/mixed.sh said so): no row
                    break
            ls = losses(f"{o}/{fw if fw != 'kiln' else 'kiln'}-{p}.{r}.loss")
            curve = curve or ls
            last10.append(sum(ls[-10:]) / len(ls[-10:]))
        if per_round:
            rows[(fw, p)] = {"name": name, "framework": fw, "precision": p,
                             "median_ms": statistics.median(per_round), "rounds_ms": per_round,
                             "p10_ms": statistics.median(p10s),
                             "loss_first": curve[0], "loss_last10": statistics.median(last10),
                             "curve": curve}

    load = open(f"{o}/load.txt").read().split("\n") if os.path.exists(f"{o}/load.txt") else []
    print(f"nanoGPT CPU config (batch 12 x ctx 64), {a.steps} steps x {a.rounds} rounds, "
          f"{a.threads} thread(s); PyTorch attention: {a.attention}")
    print("(ms/step: the median of the rounds' medians; p10: of the rounds' 10th percentiles, "
          "the less disturbed steps where the machine is shared)")
    print(f"load average (1/5/15 min) before the rounds and after each: "
          f"{'; '.join(x for x in load if x)}")
    print(f"{'trainer':34} {'median ms/step':>14} {'rounds':>24} {'p10':>7} {'tokens/s':>9} "
          f"{'loss step0':>10} {'loss last10':>11}")
    for fw, p, name in TRAINERS:
        row = rows.get((fw, p))
        if not row:
            why = "not run: kilnc has no --precision" if fw == "kiln" else "failed: see its .err file"
            print(f"{name:34} ({why})")
            continue
        rs = " ".join(f"{x:.1f}" for x in row["rounds_ms"])
        print(f"{name:34} {row['median_ms']:14.1f} {rs:>24} {row['p10_ms']:7.1f} {768 / row['median_ms'] * 1e3:9.0f} "
              f"{row['loss_first']:10.3f} {row['loss_last10']:11.3f}")

    result = {"threads": a.threads, "rounds": a.rounds, "steps": a.steps,
              "attention": a.attention, "load": [x for x in load if x],
              "rows": [{k: v for k, v in r.items() if k != "curve"} for r in rows.values()]}
    kb, kf = rows.get(("kiln", "bf16")), rows[("kiln", "fp32")]
    torch_bf16 = [rows[(fw, "bf16")] for fw in ("torch", "torch-compile") if (fw, "bf16") in rows]
    if not torch_bf16:
        print("\nno PyTorch bf16 row: nothing to compare with")
        return 1
    fastest = min(torch_bf16, key=lambda r: r["median_ms"])
    print()
    if kb:
        per_round = [b / f for b, f in zip(kb["rounds_ms"], kf["rounds_ms"])]
        r1 = kb["median_ms"] / kf["median_ms"]
        r2 = fastest["median_ms"] / kb["median_ms"]
        ok1, ok2 = r1 <= 1.0, r2 >= 1.5
        print(f"Kiln bf16 / Kiln fp32 time: {r1:.2f} (per round {' '.join(f'{x:.2f}' for x in per_round)}); "
              f"target <= 1.00: {'MET' if ok1 else 'NOT MET'}")
        print(f"Kiln bf16 speedup over the fastest PyTorch bf16 ({fastest['name']}, "
              f"{fastest['median_ms']:.1f} ms): {r2:.2f}x; target >= 1.50x: {'MET' if ok2 else 'NOT MET'}")
        result.update(kiln_bf16_over_fp32=r1, speedup_vs_fastest_torch_bf16=r2,
                      fastest_torch_bf16=fastest["name"], targets_met=ok1 and ok2)
    else:
        print("Kiln bf16: NOT MEASURED (kilnc has no --precision: the mixed-precision pass is not "
              "in this build); targets not judged")
        print(f"what Kiln bf16 must beat: <= {kf['median_ms']:.1f} ms (Kiln fp32) and "
              f"<= {fastest['median_ms'] / 1.5:.1f} ms (the fastest PyTorch bf16, {fastest['name']}, "
              f"{fastest['median_ms']:.1f} ms, / 1.5)")
        result.update(kiln_bf16_over_fp32=None, speedup_vs_fastest_torch_bf16=None,
                      fastest_torch_bf16=fastest["name"], targets_met=None)

    # Loss curves (round 1 of each: all rounds of a trainer are the same run).
    print(f"\nloss curves, mean |loss difference| per step over the first {a.curve_steps} steps:")
    tb, tf = rows.get(("torch", "bf16")), rows.get(("torch", "fp32"))
    pairs = []
    if kb:
        pairs.append((kb, kf, "rounding only: same initial values and batches"))
    if tb and tf:
        pairs.append((tb, tf, "rounding only: same initial values and batches"))
        pairs.append((kf, tf, "the noise: other initial values and batches"))
        if kb:
            pairs.append((kb, tb, "judged against the line above"))
    curves = {}
    for x, y, why in pairs:
        d, n = mean_abs_diff(x["curve"], y["curve"], a.curve_steps)
        key = f"{x['name']} vs {y['name']}"
        curves[key] = d
        print(f"  {key:58} {d:.4f} over {n} steps ({why})")
    if kb and tb and tf:
        noise = curves[f"{kf['name']} vs {tf['name']}"]
        got = curves[f"{kb['name']} vs {tb['name']}"]
        # Within noise: the bf16 pair differs by at most 1.5x what the fp32
        # pair (no rounding difference at all) differs by.
        within = got <= 1.5 * noise
        print(f"  Kiln bf16 vs PyTorch autocast: {'within noise' if within else 'OUTSIDE noise'} "
              f"({got:.4f} against 1.5 x {noise:.4f} for fp32)")
        result["curves_within_noise"] = within
    result["curves_mean_abs_diff"] = curves
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
