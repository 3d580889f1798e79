#!/usr/bin/env bash
# Runs Kiln's libFuzzer targets (test/fuzz/*.cpp) over seed corpora made from
# the examples.
#
#   test/fuzz/run.sh FUZZ_BIN BIN WORK [RUNS] [SECONDS]
#
# FUZZ_BIN: the clang ASan/UBSan build's bin/ (kiln-fuzz-*); BIN: a normal
# build's bin/ (kilnc, kiln-run make the seeds); WORK: a folder for corpora
# and crash files. Each target runs RUNS executions (default 2000) or
# SECONDS seconds (default 60), whichever ends first; a crash, a leak, UB or
# a broken invariant fails the script and leaves the input in WORK/crashes/.
# KILN_FUZZ_TARGETS (default "frontend artifact checkpoint data") picks
# targets, e.g. to run two campaigns side by side on two cores.
# scripts/test.sh runs a short pass; docs/testing.md has the long campaign.
set -euo pipefail
FUZZ_BIN=$1 BIN=$2 WORK=$3 RUNS=${4:-2000} SECONDS_EACH=${5:-60}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$WORK"/seeds/{frontend,artifact,checkpoint,data} "$WORK"/corpus "$WORK"/crashes

# Seeds. Model files: the examples and each model of the frontend tests
# (split-file sections), less the limit tests (a 250000-op model takes a
# minute under ASan and teaches the fuzzer nothing new).
cp "$SRC"/examples/*.kiln "$WORK"/seeds/frontend/
SPLIT_FILE=$(command -v split-file || echo /usr/lib/llvm-19/bin/split-file)
for f in "$SRC"/test/frontend/*.kiln; do
  case $f in *errors-limits.kiln) continue ;; esac
  d=$(mktemp -d)
  if grep -q '^#--- ' "$f"; then "$SPLIT_FILE" "$f" "$d" 2>/dev/null || true; else cp "$f" "$d"/; fi
  for m in "$d"/*; do [ -f "$m" ] && cp "$m" "$WORK/seeds/frontend/$(basename "$f" .kiln)-$(basename "$m")"; done
  rm -rf "$d"
done
# Artifacts and a checkpoint of the MLP.
if [ ! -f "$WORK"/seeds/checkpoint/mlp.safetensors ]; then
  "$BIN"/kilnc "$SRC"/examples/mlp.kiln --omit-zero-initializers -o "$WORK"/seeds/artifact/mlp.kpack 2>/dev/null
  "$BIN"/kilnc "$SRC"/examples/mlp.kiln --batch 4 -o "$WORK"/mlp4.kpack 2>/dev/null
  python3 "$SRC"/test/runtime/Inputs/make_classification.py "$WORK"/mlpdata >/dev/null
  "$BIN"/kiln-run train "$WORK"/mlp4.kpack --data "$WORK"/mlpdata/train --steps 1 \
    --eval-interval 0 --quiet --checkpoint "$WORK"/seeds/checkpoint/mlp.safetensors >/dev/null
fi
# Multi-device artifacts, so the plan's mesh, per-device buffer plans,
# collectives, queues, dependencies and pipeline stages get fuzzed too: data
# parallelism, ZeRO-1/2, tensor parallelism (alone and with dp and ZeRO),
# pipelines (1F1B, GPipe with dp and ZeRO, interleaved) and gradient
# accumulation. Tiny widths keep each seed around 0.1-0.3 MiB.
if [ ! -f "$WORK"/seeds/artifact/pp3dp2-gpipe.kpack ]; then
  A="$WORK"/seeds/artifact TINY="--param hidden=16 --omit-zero-initializers"
  MLP="$SRC"/examples/mlp.kiln IN="$SRC"/test/runtime/Inputs
  sed -e 's/^  steps = 500$/  steps = 500\n  grad_accum = 2\n  grad_clip = 0.5/' "$MLP" >"$WORK"/accum.kiln
  {
    "$BIN"/kilnc "$MLP" $TINY --devices 2 --batch 8 -o "$A"/dp2.kpack
    "$BIN"/kilnc "$MLP" $TINY --devices 4 --batch 4 --zero 1 -o "$A"/dp4-zero1.kpack
    "$BIN"/kilnc "$MLP" $TINY --devices 2 --batch 8 --zero 2 -o "$A"/dp2-zero2.kpack
    "$BIN"/kilnc "$IN"/tp_mlp.kiln $TINY --tp 2 --batch 8 -o "$A"/tp2.kpack
    "$BIN"/kilnc "$IN"/tp_mlp.kiln $TINY --devices 4 --tp 2 --zero 1 --batch 4 -o "$A"/dp2-tp2-zero1.kpack
    "$BIN"/kilnc "$IN"/pp_mlp3.kiln $TINY --param features=16 --micro-batches 4 --pipeline 1f1b \
      --batch 8 -o "$A"/pp3-1f1b.kpack
    "$BIN"/kilnc "$MLP" $TINY --pp 2 --micro-batches 2 --pipeline interleaved --batch 8 \
      -o "$A"/pp2-interleaved.kpack
    "$BIN"/kilnc "$WORK"/accum.kiln $TINY --devices 2 --batch 8 -o "$A"/dp2-accum2.kpack
    "$BIN"/kilnc "$IN"/pp_mlp3.kiln $TINY --param features=16 --micro-batches 2 --pipeline gpipe \
      --devices 6 --zero 1 --batch 4 -o "$A"/pp3dp2-gpipe.kpack
  } >/dev/null 2>&1
fi
# Small hand-made files: a checkpoint without Kiln's CRC, .npy arrays of
# every dtype the loader takes, token files (the first byte picks the reader).
python3 - "$WORK"/seeds "$SRC"/examples/data/tinyshakespeare.txt <<'PY'
import io, json, struct, sys
import numpy as np
out, text = sys.argv[1], sys.argv[2]
hdr = {"__metadata__": {"step": "3"},
       "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
       "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
h = json.dumps(hdr).encode()
body = np.arange(6, dtype=np.float32).tobytes() + np.array([1, -2], dtype=np.int64).tobytes()
open(f"{out}/checkpoint/small.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + body)
rng = np.random.default_rng(0)
arrays = {"f4": rng.standard_normal((4, 3)).astype(np.float32),
          "f8": rng.standard_normal((5,)),
          "i4": rng.integers(0, 5, (6,), dtype=np.int32),
          "i8": rng.integers(-3, 9, (2, 2), dtype=np.int64),
          "u1": rng.integers(0, 255, (7,), dtype=np.uint8),
          "u2": rng.integers(0, 65, (3, 4), dtype=np.uint16)}
for name, a in arrays.items():
    b = io.BytesIO(); np.save(b, a)
    open(f"{out}/data/npy-{name}", "wb").write(b"\x00" + b.getvalue())
chars = sorted(set(open(text).read()))
toks = np.array([chars.index(c) for c in open(text).read()[:600]])
open(f"{out}/data/tokens-u16", "wb").write(b"\x01" + toks.astype("<u2").tobytes())
open(f"{out}/data/tokens-u32", "wb").write(b"\x02" + toks.astype("<u4").tobytes())
PY

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for t in ${KILN_FUZZ_TARGETS:-frontend artifact checkpoint data}; do
  mkdir -p "$WORK"/corpus/$t
  maxlen=4096
  [ $t = artifact ] && maxlen=4194304
  [ $t = checkpoint ] && maxlen=2097152
  log="$WORK"/$t.log
  if "$FUZZ_BIN"/kiln-fuzz-$t "$WORK"/corpus/$t "$WORK"/seeds/$t -runs="$RUNS" \
       -max_total_time="$SECONDS_EACH" -max_len=$maxlen -timeout=20 -rss_limit_mb=4096 \
       -artifact_prefix="$WORK"/crashes/$t- -print_final_stats=1 >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz $t: $execs executions, no crash"
  else
    echo "fuzz $t: FAILED (log: $log, inputs: $WORK/crashes/)"
    tail -n 40 "$log"
    status=1
  fi
done
exit $status
