#!/usr/bin/env python3
"""The planner's predictions against measured step times on CPU devices.

    bench/planner.py [--model M.kiln] [--devices N] [--steps S] [--rounds R]
                     [--build build]

Runs `kilnc MODEL --parallel=auto --devices N` (no budget: every layout is
ranked), then compiles each applicable layout with its flags (--devices N
--tp T --zero K, or --pp P --micro-batches M for a pipeline; --only RE
keeps the layouts whose name matches RE) and trains it with `kiln-run train X.kpack --device cpu:N
--steps S --eval-interval 0 --log-interval 1` in R rounds that interleave
the layouts (a noisy neighbour slows all of them alike); each round plans
again first, so each prediction is calibrated under the load its runs see.
Per layout: the median predicted ms/step over the rounds (and its compute
and exposed-communication parts), the measured median ms/step over steps
6..S of every round (the first five are warm-up), their ratio, the rounds
one by one, and both per training row (the layouts train
different global batches: dp x batch x micro-batches rows). Prints the table with the
planner's machine constants and the load average, and writes it to
bench/results/planner-<UTC time>.{txt,json}.

Needs data/shakespeare_char (kiln-run prepare examples/data/tinyshakespeare.txt
data/shakespeare_char) for the default model.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROW = re.compile(
    r"^\s*(\d+)\s+(dp=\d+ tp=\d+ zero=\d+|pp=\d+ dp=\d+ tp=\d+ M=\d+)\s+([\d.]+) MiB\s+"
    r"([\d.]+) MiB\s+(yes|no)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+"
    r"([\d.e-]+)\s+(-|[\d.]+%)\s+(.*)$")
FIELD = re.compile(r"(pp|dp|tp|zero|M)=(\d+)")
STEP = re.compile(r"^step\s+(\d+)/\d+ .*\|\s*([\d.]+) ms/step")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="examples/shakespeare_char_cpu.kiln")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", default="", help="regex: measure only the layouts it matches")
    a = ap.parse_args()
    kilnc = os.path.join(a.build, "bin", "kilnc")
    kiln_run = os.path.join(a.build, "bin", "kiln-run")

    def predict():
        plan = subprocess.run([kilnc, a.model, "--parallel=auto", "--devices", str(a.devices)],
                              capture_output=True, text=True)
        if plan.returncode != 0:
            sys.exit(f"planner.py: kilnc --parallel=auto failed ({plan.returncode}):\n"
                     f"{plan.stderr}")
        rows = {}
        for line in plan.stdout.splitlines():
            m = ROW.match(line)
            if m:
                f = {"pp": 1, "dp": 1, "tp": 1, "zero": 0, "M": 1}
                f.update({k: int(v) for k, v in FIELD.findall(m[2])})
                rows[m[2]] = {
                    "rank": int(m[1]), "pp": f["pp"], "dp": f["dp"], "tp": f["tp"],
                    "zero": f["zero"], "micro_batches": f["M"],
                    "memory_mib": float(m[3]), "predicted_ms": float(m[6]),
                    "predicted_compute_ms": float(m[7]), "predicted_exposed_ms": float(m[9]),
                    "rows": int(m[10]), "predicted_ms_per_row": float(m[11]),
                    "bubble": m[12], "layout": m[2]}
        if not rows:
            sys.exit("planner.py: no ranked layout in kilnc's report:\n" + plan.stdout)
        return plan.stdout, rows

    report, first = predict()
    layouts = sorted((l for l in first.values() if re.search(a.only, l["layout"])),
                     key=lambda l: l["rank"])
    for l in layouts:
        for k in ("predicted_ms", "predicted_compute_ms", "predicted_exposed_ms",
                  "predicted_ms_per_row"):
            l[k + "_rounds"] = []
    tmp = tempfile.mkdtemp(prefix="kiln-planner-")
    for l in layouts:
        flags = ["--devices", str(a.devices)]
        if l["tp"] > 1:
            flags += ["--tp", str(l["tp"])]
        if l["zero"] > 0:
            flags += ["--zero", str(l["zero"])]
        if l["pp"] > 1:
            flags += ["--pp", str(l["pp"]), "--micro-batches", str(l["micro_batches"])]
        l["flags"] = " ".join(flags)
        l["kpack"] = os.path.join(
            tmp, f"pp{l['pp']}m{l['micro_batches']}dp{l['dp']}tp{l['tp']}z{l['zero']}.kpack")
        subprocess.run([kilnc, a.model, *flags, "-o", l["kpack"]], check=True,
                       capture_output=True)
        l["steps_ms"], l["errors"] = [], []

    loads = [os.getloadavg()[0]]
    for r in range(a.rounds):
        # Predictions calibrated in this round, next to its runs: the
        # machine's load moves both alike.
        report, rows = predict() if r > 0 else (report, first)
        for l in layouts:
            for k in ("predicted_ms", "predicted_compute_ms", "predicted_exposed_ms",
                      "predicted_ms_per_row"):
                l[k + "_rounds"].append(rows[l["layout"]][k])
            l["measured_rounds"] = l.get("measured_rounds", [])
            round_steps = []
            run = subprocess.run(
                [kiln_run, "train", l["kpack"], "--device", f"cpu:{a.devices}", "--steps",
                 str(a.steps), "--eval-interval", "0", "--log-interval", "1",
                 "--checkpoint", os.path.join(tmp, "ckpt.safetensors")],
                capture_output=True, text=True)
            if run.returncode != 0:
                l["errors"].append(run.stderr.strip().splitlines()[-1:])
                continue
            for line in (run.stdout + run.stderr).splitlines():
                m = STEP.match(line)
                if m and int(m[1]) > a.warmup:
                    round_steps.append(float(m[2]))
            l["steps_ms"] += round_steps
            if round_steps:
                l["measured_rounds"].append(statistics.median(round_steps))
            loads.append(os.getloadavg()[0])
    for l in layouts:
        for k in ("predicted_ms", "predicted_compute_ms", "predicted_exposed_ms",
                  "predicted_ms_per_row"):
            l[k] = statistics.median(l[k + "_rounds"])

    out = []
    out.append(f"planner: {a.model} on {a.devices} in-process CPU devices; {a.rounds} rounds, "
               f"each: kilnc --parallel=auto (calibrated then), then every layout for "
               f"{a.steps} steps; predicted: median over the rounds; measured: median of steps "
               f"{a.warmup + 1}..{a.steps} of every round")
    out.append(f"load average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f} "
               f"on {os.cpu_count()} cores")
    out.append("")
    out.append(f"{'layout':<18} {'predicted':>9} {'compute':>8} {'exposed':>8} {'measured':>9} "
               f"{'meas/pred':>9} {'rows':>5} {'pred/row':>9} {'meas/row':>9}  rank")
    for l in layouts:
        if not l["steps_ms"]:
            l["measured_ms"] = None
            out.append(f"{l['layout']:<18} {l['predicted_ms']:>9.1f} "
                       f"{l['predicted_compute_ms']:>8.1f} {l['predicted_exposed_ms']:>8.1f} "
                       f"{'failed':>9}  {l['errors']}")
            continue
        med = statistics.median(l["steps_ms"])
        l["measured_ms"] = med
        l["measured_ms_per_row"] = med / l["rows"]
        out.append(f"{l['layout']:<18} {l['predicted_ms']:>9.1f} {l['predicted_compute_ms']:>8.1f} "
                   f"{l['predicted_exposed_ms']:>8.1f} {med:>9.1f} "
                   f"{med / l['predicted_ms']:>9.2f} {l['rows']:>5} "
                   f"{l['predicted_ms_per_row']:>9.3f} {med / l['rows']:>9.3f}  {l['rank']}")
    measured = sorted((l for l in layouts if l["measured_ms"]),
                      key=lambda l: l["measured_ms_per_row"])
    out.append("")
    out.append("per round, predicted / measured ms/step:")
    for l in layouts:
        out.append(f"  {l['layout']:<18} " + "  ".join(
            f"{p:.1f}/{m:.1f}" for p, m in zip(l["predicted_ms_rounds"], l["measured_rounds"])))
    out.append("")
    out.append("measured order (ms/row): " + ", ".join(l["layout"] for l in measured))
    out.append("predicted order (ms/row): " + ", ".join(l["layout"] for l in layouts))
    text = "\n".join(out)
    print(report)
    print(text)
    os.makedirs("bench/results", exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    with open(f"bench/results/planner-{stamp}.txt", "w") as f:
        f.write(report + "\n" + text + "\n")
    with open(f"bench/results/planner-{stamp}.json", "w") as f:
        json.dump({"report": report, "layouts": layouts, "loads": loads}, f, indent=1)


if __name__ == "__main__":
    main()
