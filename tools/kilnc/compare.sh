#!/usr/bin/env bash
# Compares two kilnc builds' outputs (stdout, stderr, exit code, and the
# bytes of a written .kpack) over the examples, the layout and precision
# flags and a few errors: the check that a refactoring of kilnc or
# compiler/Driver leaves its behaviour as it was.
#
#   tools/kilnc/compare.sh BEFORE/kilnc AFTER/kilnc
#
# Prints one line per differing output and a count (VERBOSE=1: every
# command and its exit code too); exit 1 on any difference.
set -u
before=$1 after=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cases=()
models=(examples/*.kiln examples/tutorials/*.kiln)
for m in "${models[@]}"; do
  for e in "--emit=plan" "--emit=counters" "" "--fusion-report" "--emit=mlir"; do
    cases+=("$m $e")
  done
  cases+=("$m -o $work/out.kpack")
done
s=examples/shakespeare_char_cpu.kiln
for layout in "--devices 2" "--devices 2 --zero 1" "--tp 2" "--pp 2 --micro-batches 4" \
              "--precision bf16" "--target=cuda"; do
  for e in "--emit=plan" "--emit=counters" "" "--fusion-report"; do
    cases+=("$s $layout $e")
  done
  cases+=("$s $layout -o $work/out.kpack")
done
cases+=(
  "$s --precision bf16 --precision-report"
  "$s --precision bf16 --precision-report=json"
  "$s --target=cuda --gpu-cost=H100-SXM"
  "$s --target=cuda --emit=cuda"
  "examples/mlp.kiln --gradcheck"
  "examples/mlp.kiln --parallel=auto --devices 2 --planner-machine=cores=2,gflops=100,gbps=20,latency-us=50,busbw-gbps=5"
  "$s --parallel=auto --devices 2 --planner-machine=cores=2,gflops=100,gbps=20,latency-us=50,busbw-gbps=5 --emit=plan"
  "$s --parallel=auto --devices 2 --memory-per-device=lots"
  "$s --parallel=auto --devices 2 --planner-margin=20"
  "$s --zero 1"
  "$s --tp 3 --devices 2"
  "$s --pp 3 --devices 2"
  "$s --devices 2 --zero 3"
  "$s --precision fp8"
  "$s --precision-mode autocast"
  "$s --target=tpu"
  "$s --gpu-cost=H100-SXM"
  "$s --gpu-cost=nope --target=cuda"
  "$s --target=cuda --cuda-columns=rows --emit=plan"
  "$s --parallel=auto --tp 2"
  "$s --parallel=manual"
  "$s --emit=kpack"
  "$s --dim B"
  "$s --param x"
  "$s --batch 0"
  "$s --log-level loud"
  "examples/no-such-model.kiln"
  "examples"
  "test/frontend/errors-syntax.kiln"
  "test/frontend/warn-unused.kiln --dim B=2"
  "test/codegen/Inputs/dp_step.mlir --emit=plan"
  "test/codegen/Inputs/dp_step.mlir --emit=train"
  "test/codegen/Inputs/dp_step.mlir --parallel=auto --devices 2"
  "$work/mlp.mlir --emit=counters"
  "$work/bad.mlir"
  "examples/mlp.kiln --export-reference $work/ref --devices 2"
  "$s --gradcheck --tp 2"
  "examples/mlp.kiln --precision-report"
  "$s --precision bf16 --no-fusion --precision-report"
  "examples/mlp.kiln --emit=train"
  "examples/mlp.kiln --emit=llvm"
  "examples/mlp.kiln --emit=kernels"
  "examples/mlp.kiln --emit=fused"
)
"$before" examples/mlp.kiln --emit=mlir >"$work/mlp.mlir"
echo 'this is not MLIR' >"$work/bad.mlir"

n=0 diffs=0
for c in "${cases[@]}"; do
  for which in before after; do
    bin=${!which}
    rm -f "$work/out.kpack"
    # shellcheck disable=SC2086
    "$bin" $c >"$work/$which.out" 2>"$work/$which.err"
    echo $? >"$work/$which.rc"
    # NVRTC's compile time is the one part that varies from run to run.
    sed -i -E 's/ in [0-9.]+ s;/ in T s;/' "$work/$which.err"
    if [ -f "$work/out.kpack" ]; then cp "$work/out.kpack" "$work/$which.kpack"; else : >"$work/$which.kpack"; fi
  done
  [ -n "${VERBOSE:-}" ] && echo "rc $(cat "$work/after.rc"): kilnc $c"
  for part in out err rc kpack; do
    n=$((n + 1))
    if ! cmp -s "$work/before.$part" "$work/after.$part"; then
      diffs=$((diffs + 1))
      echo "DIFFERS ($part): kilnc $c"
      diff "$work/before.$part" "$work/after.$part" | head -5
    fi
  done
done
echo "compared $n outputs of ${#cases[@]} commands: $diffs differ"
[ "$diffs" = 0 ]
