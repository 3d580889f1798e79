#!/usr/bin/env bash
# Inter-op threads on the CPU GPT (docs/runtime.md "Inter-op threads"):
# nanoGPT's CPU config (examples/shakespeare_char_cpu.kiln) trained with
#   --threads 2 --inter-op-threads 1   (intra-op only: today's default run)
#   --threads 2 --inter-op-threads 2
#   --threads 1 --inter-op-threads 2
#   --threads 1 --inter-op-threads 1
# in interleaved rounds (each round runs every configuration once, so load
# from other processes spreads over all of them). Prints the median ms/step
# of each over every round's timed steps (the first 5 of a run are
# warm-up), its spread (min .. max of the round medians), and the width of
# @train_step's dependency DAG (kilnc --emit=plan): what inter-op threads
# can run at once. The final parameters of every configuration must be
# the same bytes (cmp), as results do not depend on the thread counts.
# Then bench/interop_bound.cpp: the gain the DAG allows at most, from
# per-step times measured on one thread (robust to load, unlike ms/step).
#
#   bench/interop.sh [--steps N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=40
ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "bench/interop.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
OUT=build/bench-interop
rm -rf $OUT && mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o $OUT/gpt.kpack
build/bin/kilnc examples/shakespeare_char_cpu.kiln --emit=plan -o $OUT/plan.txt
# Kernels compile once into the cache before the timed runs.
build/bin/kiln-run train $OUT/gpt.kpack --data data/shakespeare_char/train.bin --steps 1 \
  --eval-interval 0 --quiet --checkpoint $OUT/warm.ckpt
CONFIGS="2x1 2x2 1x2 1x1"
for r in $(seq 1 "$ROUNDS"); do
  for c in $CONFIGS; do
    t=${c%x*} io=${c#*x}
    build/bin/kiln-run train $OUT/gpt.kpack --data data/shakespeare_char/train.bin \
      --steps "$STEPS" --eval-interval 0 --log-interval 1 --threads "$t" --inter-op-threads "$io" \
      --checkpoint $OUT/$c.ckpt > $OUT/$c.$r.log
  done
done
for c in $CONFIGS; do
  cmp $OUT/2x1.ckpt $OUT/$c.ckpt
done
python3 - "$OUT" "$ROUNDS" "$CONFIGS" <<'PY'
import re, statistics, sys
out, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def steps(c, r):
    return [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(f"{out}/{c}.{r}.log").read())][5:]
print("CPU GPT (examples/shakespeare_char_cpu.kiln), ms/step, median over "
      f"{rounds} interleaved rounds:")
base = statistics.median(sum((steps("2x1", r) for r in range(1, rounds + 1)), []))
for c in configs:
    t, io = c.split("x")
    all_ms = sum((steps(c, r) for r in range(1, rounds + 1)), [])
    per_round = [statistics.median(steps(c, r)) for r in range(1, rounds + 1)]
    med = statistics.median(all_ms)
    print(f"  --threads {t} --inter-op-threads {io}: {med:7.1f} ms/step "
          f"(round medians {min(per_round):.1f} .. {max(per_round):.1f}); "
          f"{base / med:.2f}x the --threads 2 run")
for line in open(f"{out}/plan.txt"):
    if line.startswith("@train_step"):
        print(line.split(";")[0])
    elif "dependency DAG" in line:
        print(line.rstrip())
        break
print("final parameters: the same bytes in every configuration")
PY
g++ -O2 -std=c++17 -I. -DKILN_HAVE_OPENBLAS=1 bench/interop_bound.cpp \
  build/runtime/cpu/libKilnRuntimeCpuJit.a build/runtime/cpu/libKilnRuntimeCpu.a \
  build/runtime/core/libKilnRuntimeCore.a -L/usr/lib/llvm-19/lib -lLLVM-19 -lopenblas -lfmt \
  -ldl -lpthread -o $OUT/interop_bound
LD_LIBRARY_PATH=/usr/lib/llvm-19/lib $OUT/interop_bound $OUT/gpt.kpack 20
