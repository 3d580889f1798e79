#!/usr/bin/env bash
# One command, three trainers, one machine, one run: nanoGPT's CPU config
# (examples/shakespeare_char_cpu.kiln) for --steps steps (default 200) in
# Kiln (compiled CPU step), PyTorch eager and JAX jit, each with the same
# number of threads, in --rounds rounds (default 3) that interleave the
# trainers, so that a noisy neighbour slows all of them alike. Prints, per
# trainer, the median ms/step over the timed steps of all rounds (the first
# 10 steps of each run are warm-up), the p10-p90 spread, the mean loss of
# the last 10 steps, Kiln's speedup, and the speedup of each round on its
# own (the spread of the ratio); then where Kiln's time goes (a --profile
# run: GEMMs by shape, kernels by op).
#
#   bench/run.sh [--steps N] [--threads N] [--rounds N]
#
# The peers live in bench/.venv (PyPI's torch and jax[cpu]; large, never
# installed by CI).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200
THREADS=$(nproc)
ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
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
rm -rf $OUT && mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o $OUT/gpt.kpack 2>/dev/null
# Kernels compile once into the cache before the timed runs.
build/bin/kiln-run train $OUT/gpt.kpack --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm.ckpt
for r in $(seq 1 "$ROUNDS"); do
  build/bin/kiln-run train $OUT/gpt.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
    --threads "$THREADS" --checkpoint $OUT/bench.ckpt --loss-log $OUT/kiln.$r.loss > $OUT/kiln.$r.log
  for fw in torch jax; do
    $VENV/bin/python bench/gpt_cpu.py --framework $fw --data data/shakespeare_char/train.bin \
      --steps "$STEPS" --threads "$THREADS" > $OUT/$fw.$r.json
  done
done
build/bin/kiln-run train $OUT/gpt.kpack --steps 50 --eval-interval 0 --quiet --profile \
  --threads "$THREADS" --checkpoint $OUT/profile.ckpt --stats-csv $OUT/stats.csv > $OUT/profile.txt
python3 bench/summarize.py "$OUT" "$THREADS" "$ROUNDS"
