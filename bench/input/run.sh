#!/usr/bin/env bash
# Input pipeline benchmark (issue 17, part C; docs/runtime.md "The input
# pipeline"). Run from anywhere after building kilnc and kiln-run:
#   1. open time of a large uint16 token file (TOKENS tokens, default 10^8:
#      200 MB) with the vocabulary check, with this tree's memory-mapped
#      TokenFile and, with --before TREE (e.g. /work/main, a tree built
#      before the change), that tree's read-and-decode one; each 3 times
#      (the first may read from disk, the others from the page cache);
#   2. loader throughput (batches/s, bench/input/loader.cpp) for the CPU
#      GPT's token windows (examples/shakespeare_char_cpu.kiln, batch 12 x
#      context 64) and an .npy classification set (examples/mlp.kiln, batch
#      128 x 64 features, 65536 rows), for each worker count and depth;
#   3. a slow source (10 ms to make each GPT batch, a step of 5 ms): the
#      share of steps that waited, by workers (1 2 4) at depth 8.
#
#   bench/input/run.sh [--before TREE] [--tokens N] [--batches N]
#                      [--workers "1 2"] [--depth "1 3 8"]
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=
TOKENS=100000000
BATCHES=3000
WORKERS="1 2"
DEPTH="1 3 8"
while [ $# -gt 0 ]; do
  case "$1" in
    --before) BEFORE=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --depth) DEPTH=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 1 ;;
  esac
done
B=build/bin
W=$(mktemp -d /tmp/kiln-input-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
CXX=${CXX:-g++}
build() { # build(TREE OUT SOURCE LIBS...)
  local tree=$1 out=$2 src=$3
  shift 3
  "$CXX" -O2 -std=c++17 -I"$tree" "$src" "$@" -lfmt -lpthread -o "$out"
}
build . "$W/open_after" bench/input/open_time.cpp build/runtime/core/libKilnRuntimeCore.a
build . "$W/loader" bench/input/loader.cpp build/runtime/train/libKilnRuntimeTrain.a \
  build/runtime/core/libKilnRuntimeCore.a
python3 -c "import sys, numpy as np; (np.random.default_rng(1).integers(0, 65, int(sys.argv[1]), dtype=np.uint16)).tofile(sys.argv[2])" "$TOKENS" "$W/big.bin"
echo "== open time, $TOKENS uint16 tokens ($(du -h "$W/big.bin" | cut -f1)), vocabulary check on"
if [ -n "$BEFORE" ]; then
  build "$BEFORE" "$W/open_before" bench/input/open_time.cpp \
    "$BEFORE/build/runtime/core/libKilnRuntimeCore.a"
  echo "before ($BEFORE: read and decode into a vector):"
  "$W/open_before" "$W/big.bin" 65 3
fi
echo "after (memory-mapped, one pass for the check):"
"$W/open_after" "$W/big.bin" 65 3

"$B/kiln-run" prepare examples/data/tinyshakespeare.txt "$W/sc" > /dev/null
"$B/kilnc" examples/shakespeare_char_cpu.kiln -o "$W/gpt.kpack" > /dev/null
"$B/kilnc" examples/mlp.kiln -o "$W/mlp.kpack" > /dev/null
python3 test/runtime/Inputs/make_classification.py "$W/cls" --train 65536 --val 256 > /dev/null
echo "== loader throughput (the consumer takes batches as fast as they come)"
"$W/loader" "$W/gpt.kpack" "$W/sc/train.bin" --batches "$BATCHES" --workers "$WORKERS" --depth "$DEPTH"
"$W/loader" "$W/mlp.kpack" "$W/cls/train" --batches "$BATCHES" --workers "$WORKERS" --depth "$DEPTH"
"$W/loader" "$W/mlp.kpack" "$W/cls/train" --batches "$BATCHES" --workers "$WORKERS" --depth "3" \
  --shuffle-buffer 1024
echo "== a slow source: 10 ms to make a batch, 5 ms per step"
"$W/loader" "$W/gpt.kpack" "$W/sc/train.bin" --batches 400 --workers "1 2 4" --depth 8 \
  --slow-ms 10 --step-ms 5
