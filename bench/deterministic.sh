#!/usr/bin/env bash
# The cost of deterministic = "devices" (docs/parallel.md "The same bits on
# any device count") against Kiln's default on the same layout, in one run:
# nanoGPT's CPU config (examples/shakespeare_char_cpu.kiln), global batch 24.
#   - 1 device x 2 threads, batch 24: default against deterministic with 8
#     chunks (8 micro-steps of 3 rows each);
#   - 2 ranks x 1 thread (mpirun), 12 rows each: default against
#     deterministic with 2 chunks (one 12-row micro-step per rank: only the
#     tree order and the norm computed from the whole gradient) and with 8
#     chunks (4 micro-steps of 3 rows per rank).
# Prints median ms/step (the first 10 steps are warm-up), each
# deterministic time as a ratio to its default, and the arena (kilnc's
# plan: parameters, optimizer state and scratch) of each. No other
# framework offers bits independent of the device count, so the peer here
# is Kiln's own default mode (bench/dp.sh compares that one with DDP).
#
#   bench/deterministic.sh [--steps N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=60
ROUNDS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "bench/deterministic.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build build --target kilnc kiln-run >/dev/null
MPIRUN=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
OUT=build/bench-deterministic
rm -rf $OUT && mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
M=examples/shakespeare_char_cpu.kiln
compile() { # name, flags...
  local name=$1; shift
  build/bin/kilnc $M "$@" -o $OUT/$name.kpack 2>&1 | tee $OUT/$name.compile
}
compile one --batch 24
compile one-det8 --batch 24 --deterministic devices --deterministic-chunks 8
compile two --devices 2
compile two-det2 --devices 2 --deterministic devices --deterministic-chunks 2
compile two-det8 --devices 2 --deterministic devices --deterministic-chunks 8
for r in $(seq 1 "$ROUNDS"); do
  for n in one one-det8; do
    build/bin/kiln-run train $OUT/$n.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
      --threads 2 --checkpoint $OUT/$n.ckpt > $OUT/$n.$r.log
  done
  for n in two two-det2 two-det8; do
    "${MPIRUN[@]}" build/bin/kiln-run train $OUT/$n.kpack --steps "$STEPS" --eval-interval 0 \
      --log-interval 1 --threads 1 --checkpoint $OUT/$n.ckpt > $OUT/$n.$r.log
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def ms(name):
    v = []
    for r in range(1, rounds + 1):
        v += [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(f"{out}/{name}.{r}.log").read())][10:]
    return statistics.median(v)
def arena(name):
    return float(re.search(r"arena ([0-9.]+) MiB", open(f"{out}/{name}.compile").read()).group(1))
print("nanoGPT CPU config, global batch 24, median ms/step and arena per device:")
for base, dets, what in [("one", ["one-det8"], "1 device x 2 threads"),
                         ("two", ["two-det2", "two-det8"], "2 ranks x 1 thread (mpirun)")]:
    b = ms(base)
    print(f"  {what}: default {b:8.2f} ms, arena {arena(base):6.2f} MiB")
    for d in dets:
        t = ms(d)
        chunks = d.split("det")[1]
        print(f"    deterministic, {chunks} chunks: {t:8.2f} ms ({t / b:.2f}x), "
              f"arena {arena(d):6.2f} MiB ({arena(d) / arena(base):.2f}x)")
PY
