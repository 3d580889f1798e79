#!/usr/bin/env python3
"""The GPU benchmark's table: Kiln against its peers (bench/gpt_gpu.py).

  gpu_table.py [ROWS.json ...] [--kiln-log KILN.log [--kiln-loss-log KILN.loss]
               [--kiln-precision fp32] [--kiln-device cuda] [--kiln-warmup 10]] [--kiln-json OUT]
               [--tokens-per-step N] [--flops-per-step F] [--peak-tflops X]

ROWS are files of JSON lines as gpt_gpu.py prints them ('-' reads stdin;
lines that are not JSON objects are skipped). A row whose framework is
"kiln" is Kiln's; --kiln-log builds one from kiln-run's output instead:

  step    11/300 | loss 3.9325 | lr 1.09e-04 | grad norm 1.904 | 32.0 ms/step | 24.0k tok/s | ETA 2s

Run kiln-run train with --log-interval 1 so each line is one step (with a
larger interval each line is an interval's mean step time, and the spread
is over those means; the script warns). Lines for steps 1..--kiln-warmup
(default 10, as the peers) are not timed. --kiln-loss-log is kiln-run's
--loss-log file ("step loss [grad_norm]" per line) for first_loss and
last10_loss; without it they come from the log's loss column (4 decimals,
interval means). Tokens per step, FLOPs per step and the peak come from
the options, else from the peer rows (same model), else tokens per step is
estimated from the log's tok/s; MFU is flops_per_step / median / peak.

Prints: framework, precision, median ms/step (p10-p90), tokens/s, MFU, the
first and last-10 losses, compile seconds and Kiln's speedup over each peer
(peer median ms / Kiln median ms; against the Kiln row of the same
precision when there is one, else the first Kiln row).
"""
import argparse
import json
import re
import statistics
import sys

LINE = re.compile(r"^step\s+(\d+)/(\d+)\s+\|\s+loss\s+(\S+)\s+\|\s+lr\s+(\S+)\s+\|\s+grad norm\s+(\S+)"
                  r"\s+\|\s+([0-9.]+) ms/step\s+\|\s+([0-9.]+)k (tok|samples)/s")


def read_rows(paths):
    rows = []
    for p in paths:
        f = sys.stdin if p == "-" else open(p)
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and "median_ms" in r:
                rows.append(r)
    return rows


def spread(ms):
    med = statistics.median(ms)
    q = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) > 1 else [med] * 9
    return med, q[0], q[-1]


def parse_kiln_log(path, warmup):
    """kiln-run's step lines -> [(step, total, loss, ms, ktok)]."""
    out = []
    for line in open(path):
        m = LINE.match(line.strip())
        if m:
            out.append((int(m[1]), int(m[2]), float(m[3]), float(m[6]), float(m[7])))
    if not out:
        raise SystemExit(f"gpu_table.py: no kiln-run step lines in {path}")
    gaps = {b[0] - a[0] for a, b in zip(out, out[1:])}
    if gaps - {1}:
        print(f"gpu_table.py: warning: {path} is not --log-interval 1 (step gaps {sorted(gaps)}); "
              "the spread is over interval means", file=sys.stderr)
    timed = [r for r in out if r[0] > warmup]
    if not timed:
        raise SystemExit(f"gpu_table.py: {path}: no steps after the {warmup} warm-up steps")
    return out, timed


def parse_loss_log(path):
    losses = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 2:
            losses.append((int(parts[0]), float(parts[1])))
    if not losses:
        raise SystemExit(f"gpu_table.py: no 'step loss' lines in {path}")
    return [l for _, l in sorted(losses)]


def common(rows, key):
    vals = {r.get(key) for r in rows if r.get(key) is not None}
    return vals.pop() if len(vals) == 1 else None


def kiln_row(a, peers):
    lines, timed = parse_kiln_log(a.kiln_log, a.kiln_warmup)
    med, p10, p90 = spread([r[3] for r in timed])
    if a.kiln_loss_log:
        losses = parse_loss_log(a.kiln_loss_log)
    else:
        losses = [r[2] for r in lines]
    tps, b, c = a.tokens_per_step, None, None
    if tps is None:
        b, c = common(peers, "batch"), common(peers, "ctx")
        tps = b * c if b and c else None
    if tps is None:  # from the log's rounded tok/s and ms/step
        est = [r[4] * 1e3 * r[3] / 1e3 for r in timed]
        tps = int(round(statistics.median(est)))
        print(f"gpu_table.py: warning: tokens per step estimated from the log as {tps}; "
              "pass --tokens-per-step", file=sys.stderr)
    flops = a.flops_per_step or common(peers, "flops_per_step")
    peak = a.peak_tflops or common([r for r in peers if r.get("precision") == a.kiln_precision],
                                   "peak_tflops")
    return {
        "framework": "kiln", "label": "kiln", "device": a.kiln_device, "precision": a.kiln_precision,
        "attention": "math", "compile_mode": None,
        "median_ms": med, "p10_ms": p10, "p90_ms": p90, "max_ms": max(r[3] for r in timed),
        "steps": lines[-1][0], "timed_steps": len(timed), "warmup_steps": a.kiln_warmup,
        "compile_s": None, "tokens_per_s": tps / (med / 1e3),
        "first_loss": losses[0], "last10_loss": sum(losses[-10:]) / len(losses[-10:]),
        "flops_per_step": flops,
        "mfu": flops / (med / 1e3) / (peak * 1e12) if flops and peak else None,
        "peak_tflops": peak, "device_name": common(peers, "device_name"),
        "batch": b, "ctx": c,
    }


def fmt(x, spec, missing="-"):
    return missing if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="*", help="files of JSON lines ('-' = stdin)")
    ap.add_argument("--kiln-log", help="kiln-run train output (--log-interval 1)")
    ap.add_argument("--kiln-loss-log", help="kiln-run --loss-log file")
    ap.add_argument("--kiln-precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--kiln-device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--kiln-warmup", type=int, default=10, help="untimed first steps of the Kiln log")
    ap.add_argument("--kiln-json", help="also write Kiln's row as a JSON line to this file")
    ap.add_argument("--tokens-per-step", type=int)
    ap.add_argument("--flops-per-step", type=float)
    ap.add_argument("--peak-tflops", type=float, help="peak for Kiln's MFU")
    a = ap.parse_args()

    rows = read_rows(a.rows)
    if a.kiln_log:
        k = kiln_row(a, [r for r in rows if r.get("framework") != "kiln"])
        rows.insert(0, k)
        if a.kiln_json:
            with open(a.kiln_json, "w") as f:
                f.write(json.dumps(k) + "\n")
    if not rows:
        raise SystemExit("gpu_table.py: no rows (give JSON files and/or --kiln-log)")
    kilns = [r for r in rows if r.get("framework") == "kiln"]
    rows = kilns + [r for r in rows if r.get("framework") != "kiln"]

    def ref(r):
        same = [k for k in kilns if k.get("precision") == r.get("precision")]
        return (same or kilns or [None])[0]

    name = common(rows, "device_name") or "?"
    b, c, st = common(rows, "batch"), common(rows, "ctx"), common(rows, "steps")
    print(f"GPT on {name}: batch {fmt(b, 'd', '?')} x {fmt(c, 'd', '?')} tokens, "
          f"{fmt(st, 'd', 'varying')} steps")
    for key in ("batch", "ctx", "steps", "flops_per_step"):
        if len({r.get(key) for r in rows if r.get(key) is not None}) > 1:
            print(f"  note: rows differ in {key}")
    w = max([len("framework")] + [len(r.get("label") or r["framework"]) for r in rows])
    hdr = (f"{'framework':{w}} {'prec':>4} {'median ms/step':>14} {'p10-p90':>17} {'tokens/s':>10} "
           f"{'MFU':>6} {'loss step0':>10} {'loss last10':>11} {'compile s':>9} {'Kiln speedup':>12}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        k = ref(r)
        if r.get("framework") == "kiln":
            sp = "-"
        elif k is None:
            sp = "n/a"
        else:
            sp = f"{r['median_ms'] / k['median_ms']:.2f}x"
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        spr = f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}"
        print(f"{r.get('label') or r['framework']:{w}} {r.get('precision', '?'):>4} "
              f"{r['median_ms']:14.2f} {spr:>17} {fmt(r.get('tokens_per_s'), '10.0f'):>10} {mfu:>6} "
              f"{fmt(r.get('first_loss'), '10.3f'):>10} {fmt(r.get('last10_loss'), '11.3f'):>11} "
              f"{fmt(r.get('compile_s'), '9.1f'):>9} {sp:>12}")
    peaks = sorted({(r.get("precision"), r.get("peak_tflops")) for r in rows if r.get("peak_tflops")})
    if peaks:
        print("MFU = flops_per_step / median / peak; peaks (TFLOP/s): " +
              ", ".join(f"{p} {v:g}" for p, v in peaks))


if __name__ == "__main__":
    sys.exit(main())
