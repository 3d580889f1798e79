#!/usr/bin/env bash
# The data-parallel step under network latency, before and after the
# step's scalars went into one exchange (docs/parallel.md "Scalars in one
# exchange"). Two simulated hosts on this machine (network namespaces, one
# rank each, OpenMPI over TCP: test/runtime/Inputs/two-hosts.sh), their
# ranks' data over a link that delays every frame by D ms each way (two TAP
# devices joined by test/runtime/Inputs/delay_link.py; this kernel has no
# netem). nanoGPT's CPU config (examples/shakespeare_char_cpu.kiln), 12 rows
# per rank, 1 thread each:
#   - separate: kilnc --separate-scalar-reductions (the loss and the
#     gradient norm in an all_reduce each, and kiln-run's own all_reduce to
#     agree on stopping after every step: three scalar exchanges);
#   - combined: the default (one all_reduce of loss, norm and stop flag).
# For D = 0 and 5 ms (and --delays), the median ms/step (the first 10 steps
# are warm-up). Needs root (ip netns).
#
#   bench/latency.sh [--steps N] [--delays "0 5"]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=40
DELAYS="0 5"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --delays) DELAYS=$2; shift 2 ;;
    *) echo "bench/latency.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build build --target kilnc kiln-run >/dev/null
export PATH=$PWD/build/bin:$PATH
OUT=$PWD/build/bench-latency
rm -rf "$OUT" && mkdir -p "$OUT"
[ -f data/shakespeare_char/train.bin ] ||
  kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
kilnc examples/shakespeare_char_cpu.kiln --devices 2 -o "$OUT/combined.kpack"
kilnc examples/shakespeare_char_cpu.kiln --devices 2 --separate-scalar-reductions \
  -o "$OUT/separate.kpack"
for d in $DELAYS; do
  for mode in separate combined; do
    TWO_HOSTS_TIMEOUT=600 bash test/runtime/Inputs/two-hosts.sh run "$OUT/$mode-$d" \
      --delay-ms "$d" train "$OUT/$mode.kpack" --data "$PWD/data/shakespeare_char/train.bin" \
      --steps "$STEPS" --eval-interval 0 --log-interval 1 --threads 1 \
      --checkpoint "$OUT/$mode-$d.ckpt" > /dev/null
  done
done
python3 - "$OUT" "$DELAYS" <<'PY'
import re, statistics, sys
out, delays = sys.argv[1], sys.argv[2].split()
def ms(mode, d):
    log = open(f"{out}/{mode}-{d}/run.log").read()
    return statistics.median([float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", log)][10:])
print("nanoGPT CPU config, 2 simulated hosts x 1 rank x 1 thread, 12 rows each, median ms/step:")
print(f"  {'one-way delay':>14}  {'separate':>9}  {'combined':>9}  saved")
for d in delays:
    a, b = ms("separate", d), ms("combined", d)
    print(f"  {d + ' ms':>14}  {a:9.2f}  {b:9.2f}  {a - b:6.2f} ms ({(a - b) / a * 100:.0f}%)")
PY
