#!/usr/bin/env bash
# Thread-split benchmark (issue 15 item 5): ms/step of kiln-run train at
# 1 and 2 threads (or the counts given), on a small character model
# (bench/threads/small_char.kiln) and on examples/shakespeare_char_cpu.kiln.
# Runs interleave the thread counts (a noisy neighbour slows all of them
# alike); each run logs every step, the first 10 are warm-up. Prints per
# model and thread count: the median ms/step over all timed steps of all
# runs, the p10-p90 spread, the median of each run's median (min-max), and
# the ratio of the medians to the first line of the model.
#
#   bench/threads/run.sh [--runs N] [--steps N] [--threads "1 2"]
#                        [--models "small gpt"] [--before PATH] [--nice N]
#                        [--env "VAR=VALUE ..."]
#
# --before PATH also times another kiln-run build (e.g. a copy of main's
# build/bin/kiln-run) on the same artifacts, interleaved with this one
# (lines "before" and "after"); --nice N runs kiln-run at that niceness,
# in a session of its own whose autogroup gets that niceness too (Linux
# shares the CPUs between sessions first, so a plain nice does little
# against other sessions' builds; -10 needs root);
# --env sets variables for the timed runs (KILN_SPLIT_MIN_US=0, ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
ARGS=("$@")
RUNS=5
STEPS=200
THREADS="1 2"
MODELS="small gpt"
BEFORE=
ENVS=
NICE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --before) BEFORE=$2; shift 2 ;;
    --env) ENVS=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    *) echo "bench/threads/run.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
if [ "$NICE" != 0 ] && [ -z "${KILN_BENCH_SESSION:-}" ]; then
  exec env KILN_BENCH_SESSION=1 setsid --wait "$0" "${ARGS[@]}"
fi
[ -n "${KILN_BENCH_SESSION:-}" ] && { echo "$NICE" > /proc/self/autogroup; } 2>/dev/null || true
OUT=${OUT:-build/bench-threads}
mkdir -p "$OUT"
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
declare -A BIN=([after]=build/bin/kiln-run)
VARIANTS=after
if [ -n "$BEFORE" ]; then BIN[before]=$BEFORE; VARIANTS="before after"; fi
declare -A SRC=([small]=bench/threads/small_char.kiln [gpt]=examples/shakespeare_char_cpu.kiln)
for m in $MODELS; do
  [ -f "$OUT/$m.kpack" ] || build/bin/kilnc "${SRC[$m]}" -o "$OUT/$m.kpack" >/dev/null 2>&1
  # Kernels compile once into the cache before the timed runs.
  for v in $VARIANTS; do
    "${BIN[$v]}" train "$OUT/$m.kpack" --steps 1 --eval-interval 0 --quiet \
      --checkpoint "$OUT/warm.ckpt" >/dev/null
  done
done
rm -f "$OUT"/*.steps
for r in $(seq 1 "$RUNS"); do
  for m in $MODELS; do
    for v in $VARIANTS; do
      for t in $THREADS; do
        env $ENVS nice -n "$NICE" "${BIN[$v]}" train "$OUT/$m.kpack" --steps "$STEPS" \
          --eval-interval 0 --log-interval 1 --threads "$t" --checkpoint "$OUT/run.ckpt" 2>&1 |
          sed -n 's/^step *\([0-9]*\)\/.*| \([0-9.]*\) ms\/step.*/\1 \2/p' > "$OUT/$m.$v.$t.$r.steps"
      done
    done
  done
done
python3 bench/threads/summarize.py "$OUT" "$RUNS" "$MODELS" "$THREADS" "$VARIANTS"
