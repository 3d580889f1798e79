#!/usr/bin/env bash
# One command, three trainers, one machine, one run: nanoGPT's CPU config
# (examples/shakespeare_char_cpu.kiln) for --steps steps (default 200) in
# Kiln (compiled CPU step), PyTorch eager and JAX jit, each with the same
# number of threads. Prints median ms/step (p10-p90 spread; the first 10
# steps are warm-up), the mean loss of the last 10 steps, and Kiln's ratios.
#
#   bench/run.sh [--steps N] [--threads N]
#
# The peers live in bench/.venv (PyPI's torch and jax[cpu]; large, never
# installed by CI).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200
THREADS=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "bench/run.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
scripts/setup.sh >/dev/null
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build build --target kilnc kiln-run >/dev/null
VENV=bench/.venv
if [ ! -x $VENV/bin/python ] || ! $VENV/bin/python -c "import torch, jax" 2>/dev/null; then
  python3 -m venv --system-site-packages $VENV
  $VENV/bin/pip install -q torch "jax[cpu]" numpy
fi
OUT=build/bench
mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o $OUT/gpt.kpack 2>/dev/null
# Kernels compile once into the cache before the timed run.
build/bin/kiln-run train $OUT/gpt.kpack --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm.ckpt
build/bin/kiln-run train $OUT/gpt.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
  --threads "$THREADS" --checkpoint $OUT/bench.ckpt --loss-log $OUT/kiln.loss > $OUT/kiln.log
$VENV/bin/python bench/gpt_cpu.py --framework torch --data data/shakespeare_char/train.bin \
  --steps "$STEPS" --threads "$THREADS" > $OUT/torch.json
$VENV/bin/python bench/gpt_cpu.py --framework jax --data data/shakespeare_char/train.bin \
  --steps "$STEPS" --threads "$THREADS" > $OUT/jax.json
python3 - "$OUT" "$THREADS" <<'PY'
import json, re, statistics, sys
out, threads = sys.argv[1], sys.argv[2]
ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(f"{out}/kiln.log").read())][10:]
losses = [float(l.split()[1]) for l in open(f"{out}/kiln.loss")]
q = statistics.quantiles(ms, n=10)
rows = [{"framework": "kiln", "median_ms": statistics.median(ms), "p10_ms": q[0], "p90_ms": q[-1],
         "first_loss": losses[0], "last10_loss": sum(losses[-10:]) / 10}]
rows += [json.load(open(f"{out}/{f}.json")) for f in ("torch", "jax")]
kiln = rows[0]["median_ms"]
print(f"nanoGPT CPU config, {len(losses)} steps, {threads} thread(s), batch 12 x 64 tokens")
print(f"{'':10} {'median ms/step':>15} {'p10-p90':>15} {'tokens/s':>9} {'loss step0':>11} {'loss last10':>12} {'Kiln speedup':>13}")
for r in rows:
    sp = r["median_ms"] / kiln
    print(f"{r['framework']:10} {r['median_ms']:15.1f} {r['p10_ms']:7.1f}-{r['p90_ms']:<7.1f} "
          f"{768 / r['median_ms'] * 1e3:9.0f} {r['first_loss']:11.3f} {r['last10_loss']:12.3f} {sp:12.2f}x")
PY
