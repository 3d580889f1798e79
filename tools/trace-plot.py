#!/usr/bin/env python3
"""Renders a `kiln-run train --trace` file as a PNG timeline.

Usage: trace-plot.py TRACE -o OUT.png [--steps A:B] [--width INCHES] [--dpi N]

One row per track (process / thread, as Perfetto shows them), every slice a
bar coloured by its kind (kernel, GEMM, collective, wait, data wait, idle,
...), nested slices drawn thinner inside their parents, the widest bars
labelled with their names. --steps picks the training steps shown (default:
the first two of the trace), by the first process's step slices. For the
README and for machines where ui.perfetto.dev cannot be opened. Needs
matplotlib (pip install matplotlib).
"""
import argparse
import collections
import json
import sys

COLOURS = {
    "step": "#d9d9d9", "data wait": "#e41a1c", "host to device": "#ff7f00",
    "evaluation": "#a65628", "checkpoint": "#f781bf", "kernel": "#377eb8",
    "gemm": "#4daf4a", "copy": "#999999", "collective": "#984ea3",
    "collective wait": "#e7298a", "idle": "#ffffb3",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--steps", help="steps A:B to show (default: the first two traced)")
    ap.add_argument("--width", type=float, default=12)
    ap.add_argument("--dpi", type=int, default=100)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        sys.exit(f"trace-plot: needs matplotlib ({e}); pip install matplotlib")

    doc = json.load(open(a.trace))
    ev = doc["traceEvents"]
    procs, threads, psort, tsort = {}, {}, {}, {}
    for e in ev:
        if e.get("ph") != "M":
            continue
        args = e.get("args", {})
        if e["name"] == "process_name":
            procs[e["pid"]] = args["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = args["name"]
        elif e["name"] == "process_sort_index":
            psort[e["pid"]] = args["sort_index"]
        elif e["name"] == "thread_sort_index":
            tsort[(e["pid"], e["tid"])] = args["sort_index"]
    slices = [e for e in ev if e.get("ph") == "X"]
    steps = sorted((e for e in slices if e.get("cat") == "step"),
                   key=lambda e: (e["pid"], e["args"]["step"]))
    if not steps:
        sys.exit(f"trace-plot: {a.trace} has no step slices")
    first = [e for e in steps if e["pid"] == steps[0]["pid"]]
    if a.steps:
        lo, hi = (int(x) for x in a.steps.split(":"))
    else:
        lo = first[0]["args"]["step"]
        hi = lo + 2
    shown = [e for e in first if lo <= e["args"]["step"] < hi]
    if not shown:
        sys.exit(f"trace-plot: no steps {lo}..{hi - 1} in {a.trace}")
    t0 = min(e["ts"] for e in shown)
    t1 = max(e["ts"] + e["dur"] for e in shown)
    span = t1 - t0
    t0 -= span * 0.01
    t1 += span * 0.01
    keep = [e for e in slices if e["ts"] < t1 and e["ts"] + e["dur"] > t0]

    tracks = sorted({(e["pid"], e["tid"]) for e in keep},
                    key=lambda k: (psort.get(k[0], k[0]), tsort.get(k, k[1])))
    row = {k: i for i, k in enumerate(tracks)}
    height = 0.6 + 0.45 * len(tracks)
    fig, ax = plt.subplots(figsize=(a.width, height + 0.9), dpi=a.dpi)
    # Depth within a track: nested slices drawn thinner.
    by_track = collections.defaultdict(list)
    for e in keep:
        by_track[(e["pid"], e["tid"])].append(e)
    used = set()
    ms_per_inch = (t1 - t0) / 1e3 / (a.width * 0.72)
    for k, evs in by_track.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            depth = len(stack)
            stack.append(e["ts"] + e["dur"])
            cat = e.get("cat", "other")
            used.add(cat)
            h = 0.8 * (0.6 ** depth)
            y = row[k] - h / 2
            start = (max(e["ts"], t0) - t0) / 1e3
            width = (min(e["ts"] + e["dur"], t1) - max(e["ts"], t0)) / 1e3
            ax.broken_barh([(start, width)], (y, h), facecolors=COLOURS.get(cat, "#cccccc"),
                           edgecolor="none")
            label = e["name"] if len(e["name"]) < 40 else e["name"][:37] + "..."
            # Labelled where the text fits in the bar (6.5 pt characters
            # about 0.55 em wide, on axes about 0.72 of the figure).
            text = len(label) * 6.5 * 0.55 / 72 * ms_per_inch
            if width > text * 1.1:
                ax.text(start + width / 2, row[k], label, ha="center", va="center",
                        fontsize=6.5, clip_on=True)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{procs.get(p, p)}\n{threads.get((p, t), t)}" for p, t in tracks],
                       fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    what = f"step {lo}" if hi == lo + 1 else f"steps {lo}..{hi - 1}"
    ax.set_title(f"{doc.get('otherData', {}).get('model', 'kiln')}: {what} "
                 f"({a.trace.split('/')[-1]})", fontsize=9)
    handles = [Patch(color=COLOURS.get(c, "#cccccc"), label=c) for c in COLOURS if c in used]
    ax.legend(handles=handles, fontsize=7, ncol=min(6, len(handles)), loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(tracks) < 4 else -0.12), frameon=False)
    fig.tight_layout()
    fig.savefig(a.output, dpi=a.dpi)
    print(f"trace-plot: wrote {a.output} ({len(keep)} slices on {len(tracks)} tracks, "
          f"steps {lo}..{hi - 1})")


if __name__ == "__main__":
    main()
