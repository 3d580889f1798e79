#!/usr/bin/env python3
"""Reads a `kiln-run train --tensorboard DIR` directory back with TensorBoard's
own reader and compares every scalar with what kiln-run printed and logged.

  check_tensorboard.py DIR --progress TRAIN.LOG --loss-log LOSS.LOG
                       [--interval N] [--steps N] [--eval-every N]
                       [--first-step S] [--tokens]

- tags: train/loss, train/lr, train/grad_norm, perf/step_time_ms and
  perf/tokens_per_second (--tokens) or perf/samples_per_second,
  train/loss_scale and train/skipped_steps where the progress lines show a
  loss scale (equal to the printed scale's 6 digits and count), and
  val/loss (plus val/accuracy where the progress shows one) when
  --eval-every is given;
- steps: those of the progress lines ("step N/M"), which are steps done;
- values: train/loss is the mean of the loss log's losses over the interval
  (each read back as the float32 it was printed from, %.9g) and
  train/grad_norm the interval's last step's, both equal to float32
  precision: the trainer sums the same floats in double in the same order,
  so after rounding to float32 they are the same number (we allow 6e-8
  relative, at most one float32 ulp, and find none needed); the
  printed values (lr, ms/step, k tok/s, val loss, accuracy) agree within
  half a unit of their last printed digit.

Prints "ok: ..." and exits 0, or names every mismatch and exits 1. The
tensorboard package must be installed (scripts/setup.sh); lit runs this test
only where it is, and always in CI (CI=true), where a missing package fails.
"""
import argparse
import glob
import math
import os
import re
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
except ImportError as e:
    sys.exit("check_tensorboard.py: the tensorboard package is missing (%s); "
             "pip install tensorboard, or run scripts/setup.sh" % e)

PROGRESS = re.compile(r"step\s+(\d+)/\d+ \| loss ([0-9.]+) \| lr ([0-9.e+-]+) \| grad norm "
                      r"([0-9.]+|-?nan|inf) \| ([0-9.]+) ms/step \| ([0-9.]+)k (tok|samples)/s")
# Loss scaling adds "| scale S skipped N" after the grad norm (docs/training.md).
SCALER = re.compile(r" \| scale (\S+) skipped (\d+)")
VAL = re.compile(r"step\s+(\d+): val loss ([0-9.]+)(?:, accuracy ([0-9.]+)%)?")


def f32(x):
    import struct
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--loss-log", required=True)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--tokens", action="store_true")
    ap.add_argument("--files", type=int, default=1, help="event files expected in DIR")
    a = ap.parse_args()
    errors = []

    files = sorted(glob.glob(os.path.join(a.dir, "events.out.tfevents.*")))
    if len(files) != a.files:
        errors.append("%d event files in %s, expected %d: %s" % (len(files), a.dir, a.files, files))
    name = re.compile(r"events\.out\.tfevents\.\d+\.[^/]+\.\d+\.kiln(\.\d+)?$")
    for f in files:
        if not name.search(f):
            errors.append("file name %s is not events.out.tfevents.<secs>.<host>.<pid>.kiln" % f)
        events = list(EventFileLoader(f).Load())
        if not events or events[0].file_version != "brain.Event:2":
            errors.append("%s: the first event is not file_version brain.Event:2" % f)
        for e in events[1:]:
            if len(e.summary.value) != 1:
                errors.append("%s: step %d holds %d values, expected one scalar per event"
                              % (f, e.step, len(e.summary.value)))

    ea = EventAccumulator(a.dir, size_guidance={"scalars": 0})
    ea.Reload()
    got = {t: [(s.step, s.value) for s in ea.Scalars(t)] for t in ea.Tags()["scalars"]}

    progress, scaler_of = [], []
    for line in open(a.progress):
        m = PROGRESS.search(SCALER.sub("", line))
        if m:
            progress.append(m)
            scaler_of.append(SCALER.search(line))
    vals = [m for m in map(VAL.search, open(a.progress)) if m]
    losslog = {}
    for line in open(a.loss_log):
        step, loss, norm = line.split()
        losslog[int(step)] = (float(loss), float(norm))
    if not progress:
        errors.append("no progress lines in %s" % a.progress)

    rate = "perf/tokens_per_second" if a.tokens else "perf/samples_per_second"
    expected = ["train/loss", "train/lr", "train/grad_norm", "perf/step_time_ms", rate]
    scaled = bool(progress) and bool(scaler_of[0])
    if scaled:
        expected += ["train/loss_scale", "train/skipped_steps"]
    if a.eval_every:
        expected.append("val/loss")
        if vals and vals[0].group(3) is not None:
            expected.append("val/accuracy")
    for t in expected:
        if t not in got:
            errors.append("tag %s missing (tags: %s)" % (t, sorted(got)))
    for t in got:
        if t not in expected:
            errors.append("unexpected tag %s" % t)
    if errors:
        print("\n".join(errors))
        return 1

    steps = [int(m.group(1)) for m in progress]
    for t in ["train/loss", "train/lr", "train/grad_norm", "perf/step_time_ms", rate]:
        if [s for s, _ in got[t]] != steps:
            errors.append("%s: steps %s, the progress lines' %s" % (t, [s for s, _ in got[t]], steps))

    # Printed values: within half a unit of the last digit (plus float32).
    def near(tag, step, value, printed, half):
        if abs(value - printed) > half + 1e-6 * abs(printed):
            errors.append("%s at step %d: %r, printed %r" % (tag, step, value, printed))

    prev = min(losslog) if losslog else 0  # the first step's index
    for (i, m) in enumerate(progress):
        step = steps[i]
        d = dict(got["train/loss"])
        # The interval: loss log steps (0-based) prev .. step-1.
        interval = [f32(losslog[k][0]) for k in range(prev, step)]  # the floats the trainer summed
        mean = 0.0
        for x in interval:
            mean += x
        mean = f32(mean / len(interval))
        if abs(d[step] - mean) > 6e-8 * abs(mean):
            errors.append("train/loss at step %d: %r, the loss log's mean over steps %d..%d %r"
                          % (step, d[step], prev, step - 1, mean))
        norm = f32(losslog[step - 1][1])
        if dict(got["train/grad_norm"])[step] != norm and not (
                math.isnan(norm) and math.isnan(dict(got["train/grad_norm"])[step])):
            errors.append("train/grad_norm at step %d: %r, the loss log's %r"
                          % (step, dict(got["train/grad_norm"])[step], norm))
        near("train/loss", step, d[step], float(m.group(2)), 5e-5)
        lr = float(m.group(3))
        near("train/lr", step, dict(got["train/lr"])[step], lr, 0.005 * 10 ** math.floor(math.log10(lr)) if lr > 0 else 0)
        near("perf/step_time_ms", step, dict(got["perf/step_time_ms"])[step], float(m.group(5)), 0.05)
        near(rate, step, dict(got[rate])[step], 1e3 * float(m.group(6)), 50)
        if scaled:
            # The scale printed with 6 significant digits; the count exactly.
            sc = float(scaler_of[i].group(1))
            near("train/loss_scale", step, dict(got["train/loss_scale"])[step], sc, 5e-6 * sc)
            if dict(got["train/skipped_steps"])[step] != float(scaler_of[i].group(2)):
                errors.append("train/skipped_steps at step %d: %r, printed %s"
                              % (step, dict(got["train/skipped_steps"])[step], scaler_of[i].group(2)))
        prev = step

    if a.eval_every:
        vsteps = [int(m.group(1)) for m in vals]
        if [s for s, _ in got["val/loss"]] != vsteps:
            errors.append("val/loss: steps %s, the progress lines' %s" % ([s for s, _ in got["val/loss"]], vsteps))
        else:
            for m in vals:
                step = int(m.group(1))
                near("val/loss", step, dict(got["val/loss"])[step], float(m.group(2)), 5e-5)
                if m.group(3) is not None:
                    near("val/accuracy", step, dict(got["val/accuracy"])[step], float(m.group(3)) / 100, 5e-5)

    if errors:
        print("\n".join(errors))
        return 1
    print("ok: %d tags, %d log points (steps %d..%d), %d evaluations, %d file(s)"
          % (len(got), len(steps), steps[0], steps[-1], len(vals), len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
