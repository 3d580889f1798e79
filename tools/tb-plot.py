#!/usr/bin/env python3
"""Plots the loss curves of `kiln-run train --tensorboard DIR` from its event
files, read with TensorBoard's own EventAccumulator (the picture in the
README's tour, docs/images/tensorboard.png):

  tools/tb-plot.py DIR -o OUT.png [--title TEXT]

Left: train/loss (the mean over each log interval) and val/loss against the
step; right: train/lr. Needs the tensorboard and matplotlib packages
(pip install tensorboard matplotlib).
"""
import argparse
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import matplotlib
except ImportError as e:
    sys.exit("tb-plot.py: %s; pip install tensorboard matplotlib" % e)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", help="the --tensorboard directory")
    ap.add_argument("-o", "--out", required=True, help="the picture to write (.png)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        sys.exit("tb-plot.py: %s is not a directory (give the --tensorboard DIR of a run)" % a.dir)
    ea = EventAccumulator(a.dir, size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    if "train/loss" not in tags:
        sys.exit("tb-plot.py: no train/loss scalars in %s (tags: %s)" % (a.dir, tags))

    def series(tag):
        s = ea.Scalars(tag) if tag in tags else []
        return [x.step for x in s], [x.value for x in s]

    fig, (ax, lr) = plt.subplots(1, 2, figsize=(8, 3), dpi=90,
                                 gridspec_kw={"width_ratios": [2, 1]})
    ax.plot(*series("train/loss"), lw=1, label="train/loss")
    if "val/loss" in tags:
        ax.plot(*series("val/loss"), "o-", lw=1.5, ms=4, label="val/loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    lr.plot(*series("train/lr"), lw=1, color="tab:green")
    lr.set_xlabel("step")
    lr.set_title("train/lr", fontsize=10)
    lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    lr.grid(alpha=0.3)
    if a.title:
        fig.suptitle(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out)
    print("wrote %s from %s (%d log points, %d evaluations)"
          % (a.out, a.dir, len(series("train/loss")[0]), len(series("val/loss")[0])))


if __name__ == "__main__":
    main()
