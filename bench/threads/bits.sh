#!/usr/bin/env bash
# Bit-identity check for the thread split: trains examples/mlp.kiln and
# examples/shakespeare_char_cpu.kiln for 50 steps on the cpu backend at 1
# and 2 threads, with this build and (with --before PATH) another kiln-run,
# and prints each final checkpoint's SHA-256 (the checkpoint holds every
# parameter and optimizer-state tensor). All hashes of a model must agree:
# which thread runs a piece never changes the arithmetic. KILN_SPLIT_MIN_US=0
# (split every step) is run too, the old behaviour's split.
#
#   bench/threads/bits.sh [--before PATH]
set -euo pipefail
cd "$(dirname "$0")/../.."
BEFORE=
[ "${1:-}" = --before ] && BEFORE=$2
OUT=build/bench-threads/bits
rm -rf "$OUT" && mkdir -p "$OUT"
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
python3 test/runtime/Inputs/make_classification.py "$OUT/data" >/dev/null
build/bin/kilnc examples/mlp.kiln -o "$OUT/mlp.kpack" >/dev/null 2>&1
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o "$OUT/gpt.kpack" >/dev/null 2>&1
run() { # label binary threads env...
  local label=$1 bin=$2 t=$3
  shift 3
  for m in mlp gpt; do
    local data=()
    [ $m = mlp ] && data=(--data "$OUT/data/train")
    env "$@" "$bin" train "$OUT/$m.kpack" "${data[@]}" --steps 50 --eval-interval 0 --quiet \
      --threads "$t" --checkpoint "$OUT/$m.$label.ckpt" >/dev/null
    printf '%-4s %-22s %s\n' $m "$label" "$(sha256sum < "$OUT/$m.$label.ckpt" | cut -c1-16)"
  done
}
for t in 1 2; do
  [ -n "$BEFORE" ] && run "before-t$t" "$BEFORE" $t
  run "after-t$t" build/bin/kiln-run $t
  run "after-t$t-split-all" build/bin/kiln-run $t KILN_SPLIT_MIN_US=0
done | sort
