#!/usr/bin/env bash
# What --trace costs (docs/profiling.md "Trace"): the CPU GPT
# (examples/shakespeare_char_cpu.kiln) for STEPS steps, in interleaved rounds
# without and with --trace (window: steps 5..STEPS, most of the run), each
# run's ms/step the mean of its progress lines after step 10 (every step
# from 11 on, all inside the window when traced). Prints each round, the
# medians and the ratio traced / plain (target: at most 1.05).
# Build first (kilnc, kiln-run in build/bin). Numbers move with whatever else
# runs on the machine: run it on a quiet one, and more rounds when it is not.
#
#   bench/trace_overhead.sh [--steps N] [--rounds N] [--threads N]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=60
ROUNDS=3
THREADS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "bench/trace_overhead.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
[ "$STEPS" -ge 30 ] || { echo "bench/trace_overhead.sh: --steps must be at least 30" >&2; exit 1; }
for t in kilnc kiln-run; do
  [ -x build/bin/$t ] || { echo "bench/trace_overhead.sh: build/bin/$t missing; build it first" >&2; exit 1; }
done
OUT=build/bench-trace
rm -rf $OUT && mkdir -p $OUT
build/bin/kiln-run prepare examples/data/tinyshakespeare.txt $OUT/sc >/dev/null
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o $OUT/gpt.kpack >/dev/null
run() { # run NAME [extra flags]: prints the mean ms/step after step 10 and
  # the run's CPU seconds (user + system: less disturbed by a busy machine
  # than wall time; start-up and, traced, writing the file included)
  local name=$1; shift
  local TIMEFORMAT='%U %S'
  { time build/bin/kiln-run train $OUT/gpt.kpack --data $OUT/sc/train.bin --steps "$STEPS" \
      --eval-interval 0 --log-interval 10 --threads "$THREADS" --checkpoint $OUT/$name.ckpt \
      "$@" > $OUT/$name.out ; } 2> $OUT/$name.time
  awk '/^step +[0-9]+\/[0-9]+ \|/ { split($2, s, "/"); if (s[1] > 10) {
         for (i = 1; i <= NF; i++) if ($i == "ms/step") { sum += $(i-1); n++ } } }
       END { if (n == 0) exit 1; printf "%.2f ", sum / n }' $OUT/$name.out
  awk '{ printf "%.2f\n", $1 + $2 }' $OUT/$name.time
}
plain=() traced=() cplain=() ctraced=()
echo "trace overhead: CPU GPT, $STEPS steps, $THREADS thread(s), $ROUNDS rounds (ms/step after step 10)"
for r in $(seq 1 "$ROUNDS"); do
  read -r p cp < <(run plain$r)
  read -r t ct < <(run traced$r --trace $OUT/trace$r.json --trace-steps 5:$STEPS)
  plain+=("$p") traced+=("$t") cplain+=("$cp") ctraced+=("$ct")
  echo "  round $r: plain $p ms/step ($cp s CPU), --trace $t ms/step ($ct s CPU," \
       "$(du -h $OUT/trace$r.json | cut -f1) trace)"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
mp=$(median "${plain[@]}") mt=$(median "${traced[@]}")
awk -v p="$mp" -v t="$mt" 'BEGIN { printf "median: plain %.2f ms/step, --trace %.2f ms/step: ratio %.3f (target <= 1.05)\n", p, t, t / p }'
cp=$(median "${cplain[@]}") ct=$(median "${ctraced[@]}")
awk -v p="$cp" -v t="$ct" 'BEGIN { printf "median CPU time per run: plain %.2f s, --trace %.2f s: ratio %.3f\n", p, t, t / p }'
