#!/usr/bin/env python3
"""Gradient accumulation's memory (issue: accumulate in place), from
`kilnc --emit=counters` of the 100-1000-1000-10 MLP with micro-batches of 4
rows:

  accum_memory.py KILNC MLP.kiln

For each pair (M = 1 micro-batch, M = 4 micro-batches) of a layout, the
scratch arena (arena_bytes - persistent_bytes: what the step allocates
besides parameters and optimizer state) may grow with M only by the
activations in flight, never by a gradient buffer per micro-batch. The
bound used, generous on purpose: M micro-batches' worth of every value the
forward pass makes per row (features + 4 x hidden + 2 x classes floats of
4 bytes: the input, each hidden layer's pre- and post-ReLU values, logits
and their softmax), which is 263,680 bytes here and far below one 1000x1000
weight gradient (4,000,000 bytes), the buffer the old plan added per
micro-batch. Prints one line per layout; exit 1 if a layout breaks the bound.
"""
import json
import os
import subprocess
import sys
import tempfile

FEATURES, HIDDEN, CLASSES, ROWS, M = 100, 1000, 10, 4, 4
BOUND = M * ROWS * (FEATURES + 4 * HIDDEN + 2 * CLASSES) * 4


def scratch(kilnc, model, flags, tmp):
    out = os.path.join(tmp, "c.json")
    cmd = [kilnc, model, "--param", f"features={FEATURES}", "--param", f"hidden={HIDDEN}",
           "--batch", str(ROWS), "--emit=counters", "-o", out] + flags
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"accum_memory.py: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    with open(out) as f:
        c = json.load(f)
    return c["arena_bytes"] - c["persistent_bytes"]


def main():
    kilnc, model = sys.argv[1], sys.argv[2]
    layouts = [
        ("grad_accum fp32", [], ["--micro-batches", str(M)]),
        ("grad_accum bf16", ["--precision=bf16"], ["--precision=bf16", "--micro-batches", str(M)]),
        ("grad_accum fp16", ["--precision=fp16"], ["--precision=fp16", "--micro-batches", str(M)]),
        ("pp 2 gpipe", ["--devices", "2", "--pp", "2", "--micro-batches", "1"],
         ["--devices", "2", "--pp", "2", "--micro-batches", str(M), "--pipeline", "gpipe"]),
        ("pp 2 1f1b", ["--devices", "2", "--pp", "2", "--micro-batches", "1"],
         ["--devices", "2", "--pp", "2", "--micro-batches", str(M), "--pipeline", "1f1b"]),
        ("dp 2 grad_accum", ["--devices", "2"], ["--devices", "2", "--micro-batches", str(M)]),
    ]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, one, many in layouts:
            a, b = scratch(kilnc, model, one, tmp), scratch(kilnc, model, many, tmp)
            ok = b - a <= BOUND
            bad += not ok
            print(f"{name}: scratch M=1 {a} bytes, M={M} {b} bytes, growth {b - a} "
                  f"{'<=' if ok else '>'} {BOUND}: {'ok' if ok else 'TOO MUCH'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
