#!/usr/bin/env python3
"""PyTorch peers of bench/mixed.sh: nanoGPT's CPU config
(examples/shakespeare_char_cpu.kiln) on the CPU in fp32 or under
torch.autocast("cpu", dtype=torch.bfloat16), eager or torch.compile.

  gpt_mixed.py --framework torch|torch-compile --precision fp32|bf16
               --data data/shakespeare_char/train.bin [--steps 200]
               [--threads 2] [--attention sdpa|math] [--warmup N]
               [--loss-log FILE]

The model, the training step and the timing are bench/gpt_gpu.py's (imported,
not copied: run_torch with --device cpu), set to the CPU config: vocabulary
65, context 64, width 128, 4 heads, 4 layers, batch 12, no dropout, the cosine
schedule over 2000 steps (as the .kiln file's train section). Attention is
F.scaled_dot_product_attention by default (PyTorch's fastest CPU attention;
--attention math for the plain form Kiln computes). bf16 is autocast's
policy: fp32 parameters and AdamW state, bf16 matmuls, fp32 softmax,
LayerNorm and cross-entropy (gpt_gpu.py: "bf16 = torch autocast to bfloat16
(fp32 master weights, fp32 optimizer)").

A step is timed from its batch on the host to the loss read as a Python
float (forward, backward, clipping, AdamW), as kiln-run times it. The first
--warmup steps (default 10; 20 for torch-compile: step 0 compiles) are not
timed. Prints ONE JSON line: framework, precision, attention, median_ms,
p10_ms, p90_ms over the timed steps, steps, warmup_steps, compile_s (step 0's
wall time, torch-compile only), first_loss, last10_loss, threads, versions.
Batches are numpy-RNG windows (seed 1337) of the token file: every PyTorch
variant sees the same batches and the same initial parameters; Kiln's
windows and initial values differ, their distribution does not.
"""
import argparse
import json
import os
import statistics
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_gpu  # noqa: E402  (the shared PyTorch model and training step)

CPU_CONFIG = dict(V=65, T=64, D=128, H=4, L=4, B=12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", choices=["torch", "torch-compile"], required=True)
    ap.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed first steps (default 10; 20 for torch-compile)")
    ap.add_argument("--loss-log", default=None, help="write 'step loss' lines, as kiln-run --loss-log")
    a = ap.parse_args()
    warmup = a.warmup if a.warmup is not None else (20 if a.framework == "torch-compile" else 10)
    if a.steps <= warmup:
        ap.error(f"--steps {a.steps} leaves no timed steps after {warmup} warm-up steps")

    # The CPU config's training: no dropout, the schedule ends at step 2000.
    gpt_gpu.DROPOUT = 0.0
    gpt_gpu.TOTAL = 2000
    args = types.SimpleNamespace(
        framework=a.framework, precision=a.precision, data=a.data, steps=a.steps,
        device="cpu", threads=a.threads, batch=CPU_CONFIG["B"], flash=a.attention == "sdpa",
        compile_mode="default", adamw="foreach")
    times, losses, _, extra = gpt_gpu.run_torch(args, CPU_CONFIG)
    if a.loss_log:
        with open(a.loss_log, "w") as f:
            for i, loss in enumerate(losses):
                f.write(f"{i} {loss:.9g}\n")
    timed = [t * 1e3 for t in times[warmup:]]
    med = statistics.median(timed)
    q = statistics.quantiles(timed, n=10, method="inclusive") if len(timed) > 1 else [med] * 9
    row = {"framework": a.framework, "precision": a.precision, "attention": a.attention,
           "median_ms": med, "p10_ms": q[0], "p90_ms": q[-1], "steps": len(losses),
           "warmup_steps": warmup,
           "compile_s": times[0] if a.framework == "torch-compile" else None,
           "first_loss": losses[0], "last10_loss": sum(losses[-10:]) / len(losses[-10:]),
           "threads": a.threads}
    row.update(extra)
    print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
