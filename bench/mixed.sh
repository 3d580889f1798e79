#!/usr/bin/env bash
# Mixed precision on the CPU, one run, six trainers: nanoGPT's CPU config
# (examples/shakespeare_char_cpu.kiln: batch 12, context 64) for --steps
# steps (default 200) with the same number of threads (default 2) in
#   Kiln fp32             kilnc
#   Kiln bf16             kilnc --precision=bf16 (the kiln-mixed-precision pass)
#   PyTorch fp32          eager and torch.compile
#   PyTorch bf16          torch.autocast("cpu", dtype=torch.bfloat16), eager
#                         and torch.compile
# (PyTorch: bench/gpt_mixed.py, F.scaled_dot_product_attention unless
# --attention math), in --rounds rounds (default 3) that interleave the
# trainers, so that a noisy neighbour slows all of them alike. Prints per
# trainer the median ms/step (the median of the rounds' medians; the first
# 10 steps of each run, 20 for torch.compile, are warm-up), the ratios the
# issue sets targets for:
#   Kiln bf16 / Kiln fp32 time           target <= 1 (no slower)
#   fastest PyTorch bf16 / Kiln bf16     target >= 1.5
# and the loss curves over the measured steps: the mean |loss difference| per
# step over the first --curve-steps steps (default all) of Kiln bf16 against
# Kiln fp32 and PyTorch bf16 against PyTorch fp32 (same initial values, same
# batches: the rounding alone), and of Kiln bf16 against PyTorch autocast
# eager next to Kiln fp32 against PyTorch fp32 (different initial values and
# batches: the latter is the noise the former is judged against).
# Writes the table and the rows to bench/results/mixed-<UTC time>.{txt,json}.
#
#   bench/mixed.sh [--steps N] [--threads N] [--rounds N] [--curve-steps N]
#                  [--attention sdpa|math]
#
# Where kilnc has no --precision (the pass is not in this build) the Kiln
# bf16 row is missing: the script says so in the table and the results, and
# the targets are not judged. The PyTorch peers run with bench/.venv's
# python (PyPI's torch; created as bench/run.sh does) or $KILN_BENCH_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200
THREADS=2
ROUNDS=3
CURVE=0
ATTN=sdpa
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --curve-steps) CURVE=$2; shift 2 ;;
    --attention) ATTN=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/mixed.sh: unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done
[ "$STEPS" -gt 20 ] || { echo "bench/mixed.sh: --steps must exceed the 20 warm-up steps" >&2; exit 1; }
[ "$CURVE" -gt 0 ] || CURVE=$STEPS

export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build build --target kilnc kiln-run >/dev/null
PY=${KILN_BENCH_PYTHON:-bench/.venv/bin/python}
if ! "$PY" -c "import torch" 2>/dev/null; then
  if [ -n "${KILN_BENCH_PYTHON:-}" ]; then
    echo "bench/mixed.sh: $KILN_BENCH_PYTHON cannot import torch" >&2; exit 1
  fi
  python3 -m venv --system-site-packages bench/.venv
  bench/.venv/bin/pip install -q torch numpy
fi
OUT=build/bench-mixed
rm -rf $OUT && mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
MODEL=examples/shakespeare_char_cpu.kiln
DATA=data/shakespeare_char/train.bin

KILN=(fp32)
build/bin/kilnc $MODEL -o $OUT/fp32.kpack 2>/dev/null
if build/bin/kilnc --help 2>/dev/null | grep -q -- '--precision='; then
  build/bin/kilnc $MODEL --precision=bf16 -o $OUT/bf16.kpack 2>$OUT/kilnc-bf16.err ||
    { echo "bench/mixed.sh: kilnc --precision=bf16 failed:" >&2; cat $OUT/kilnc-bf16.err >&2; exit 1; }
  KILN+=(bf16)
else
  echo "bench/mixed.sh: NOTE: build/bin/kilnc has no --precision flag (the mixed-precision pass" \
       "is not in this build): no Kiln bf16 row, the targets are not judged" | tee $OUT/no-bf16.txt >&2
fi
# Kernels compile once into the cache before the timed runs.
for p in "${KILN[@]}"; do
  build/bin/kiln-run train $OUT/$p.kpack --steps 1 --eval-interval 0 --quiet \
    --threads "$THREADS" --checkpoint $OUT/warm.ckpt > $OUT/warm-$p.log 2>&1 ||
    { echo "bench/mixed.sh: kiln-run train ($p, warm-up) failed:" >&2; tail -5 $OUT/warm-$p.log >&2; exit 1; }
done

cut -d' ' -f1-3 /proc/loadavg > $OUT/load.txt
for r in $(seq 1 "$ROUNDS"); do
  echo "bench/mixed.sh: round $r/$ROUNDS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  for p in "${KILN[@]}"; do
    build/bin/kiln-run train $OUT/$p.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
      --threads "$THREADS" --checkpoint $OUT/bench.ckpt --loss-log $OUT/kiln-$p.$r.loss \
      > $OUT/kiln-$p.$r.log 2>&1 ||
      { echo "bench/mixed.sh: kiln-run train ($p, round $r) failed:" >&2; tail -5 $OUT/kiln-$p.$r.log >&2; exit 1; }
  done
  for fw in torch torch-compile; do
    for p in fp32 bf16; do
      "$PY" bench/gpt_mixed.py --framework $fw --precision $p --data $DATA --steps "$STEPS" \
        --threads "$THREADS" --attention "$ATTN" --loss-log $OUT/$fw-$p.$r.loss \
        > $OUT/$fw-$p.$r.json 2> $OUT/$fw-$p.$r.err ||
        { echo "bench/mixed.sh: $fw $p failed (round $r; its row is left out):" >&2
          tail -5 $OUT/$fw-$p.$r.err >&2; rm -f $OUT/$fw-$p.$r.json; }
    done
  done
  cut -d' ' -f1-3 /proc/loadavg >> $OUT/load.txt
done
mkdir -p bench/results
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
python3 bench/mixed_summary.py "$OUT" --threads "$THREADS" --rounds "$ROUNDS" --steps "$STEPS" \
  --curve-steps "$CURVE" --attention "$ATTN" --json bench/results/mixed-$STAMP.json |
  tee bench/results/mixed-$STAMP.txt
echo "bench/mixed.sh: wrote bench/results/mixed-$STAMP.txt and .json"
