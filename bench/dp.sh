#!/usr/bin/env bash
# Data parallelism on the CPU, Kiln against PyTorch DDP, in one run
# (docs/parallel.md "The multi-rank trainer"): nanoGPT's CPU config
# (examples/shakespeare_char_cpu.kiln, batch 12 per rank) on 2 ranks x 1
# thread, the same global batch of 24 in both:
#   - Kiln: kilnc --devices 2, then mpirun -np 2 kiln-run train --threads 1;
#   - PyTorch: DistributedDataParallel over gloo, torchrun --nproc_per_node 2
#     (bench/gpt_ddp.py; torch from bench/.venv, as bench/run.sh makes it).
# Prints ms/step for each (median over the timed steps; the first 10 are
# warm-up) and Kiln's speedup (target >= 1.5x); Kiln's exposed (not
# overlapped) communication per step, from a --profile run (the step
# loop's "collective wait"); 1 rank x 2 threads (kilnc --devices 1, batch 24)
# against 2 ranks x 1 thread; Kiln's 2 ranks x 1 thread with no
# communication thread (KILN_COMM_THREAD=off: the collectives on each
# rank's own thread, docs/parallel.md "One core per rank"); one device at
# the per-rank batch (12) on 1 thread,
# the step the 2-rank run would take with free communication; and
# kiln-comm-bench: Kiln's MPI all_reduce against a plain MPI_Allreduce of
# the same bytes. Then the same 2-rank comparison in mixed precision on both
# sides (Kiln --precision bf16 against DDP with torch.autocast bf16), a
# separate line: the target above is fp32 against fp32.
#
#   bench/dp.sh [--steps N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=100
ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "bench/dp.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --build build --target kilnc kiln-run kiln-comm-bench >/dev/null
VENV=bench/.venv
if [ ! -x $VENV/bin/python ] || ! $VENV/bin/python -c "import torch" 2>/dev/null; then
  python3 -m venv --system-site-packages $VENV
  $VENV/bin/pip install -q torch numpy
fi
MPIRUN=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
OUT=build/bench-dp
rm -rf $OUT && mkdir -p $OUT
[ -f data/shakespeare_char/train.bin ] ||
  build/bin/kiln-run prepare examples/data/tinyshakespeare.txt data/shakespeare_char >/dev/null
build/bin/kilnc examples/shakespeare_char_cpu.kiln --devices 2 -o $OUT/gpt2.kpack
build/bin/kilnc examples/shakespeare_char_cpu.kiln --batch 24 -o $OUT/gpt1.kpack
build/bin/kilnc examples/shakespeare_char_cpu.kiln -o $OUT/gpt1b12.kpack
build/bin/kilnc examples/shakespeare_char_cpu.kiln --devices 2 --precision bf16 -o $OUT/gpt2bf16.kpack
# Kernels compile once into the cache before the timed runs.
build/bin/kiln-run train $OUT/gpt1.kpack --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm1.ckpt
build/bin/kiln-run train $OUT/gpt2.kpack --device cpu:2 --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm2.ckpt
build/bin/kiln-run train $OUT/gpt1b12.kpack --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm3.ckpt
build/bin/kiln-run train $OUT/gpt2bf16.kpack --device cpu:2 --steps 1 --eval-interval 0 --quiet --checkpoint $OUT/warm4.ckpt
for r in $(seq 1 "$ROUNDS"); do
  "${MPIRUN[@]}" build/bin/kiln-run train $OUT/gpt2.kpack --steps "$STEPS" --eval-interval 0 \
    --log-interval 1 --threads 1 --checkpoint $OUT/dp.ckpt > $OUT/kiln-2x1.$r.log
  build/bin/kiln-run train $OUT/gpt1.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
    --threads 2 --checkpoint $OUT/one.ckpt > $OUT/kiln-1x2.$r.log
  KILN_COMM_THREAD=off "${MPIRUN[@]}" -x KILN_COMM_THREAD build/bin/kiln-run train $OUT/gpt2.kpack \
    --steps "$STEPS" --eval-interval 0 --log-interval 1 --threads 1 --checkpoint $OUT/dpt.ckpt \
    > $OUT/kiln-2x1-inline.$r.log
  build/bin/kiln-run train $OUT/gpt1b12.kpack --steps "$STEPS" --eval-interval 0 --log-interval 1 \
    --threads 1 --checkpoint $OUT/one12.ckpt > $OUT/kiln-1x1-b12.$r.log
  $VENV/bin/torchrun --standalone --nproc_per_node 2 bench/gpt_ddp.py \
    --data data/shakespeare_char/train.bin --steps "$STEPS" --threads 1 > $OUT/ddp.$r.json
  "${MPIRUN[@]}" build/bin/kiln-run train $OUT/gpt2bf16.kpack --steps "$STEPS" --eval-interval 0 \
    --log-interval 1 --threads 1 --checkpoint $OUT/dpbf16.ckpt > $OUT/kiln-2x1-bf16.$r.log
  $VENV/bin/torchrun --standalone --nproc_per_node 2 bench/gpt_ddp.py \
    --data data/shakespeare_char/train.bin --steps "$STEPS" --threads 1 --precision bf16 \
    > $OUT/ddp-bf16.$r.json
done
"${MPIRUN[@]}" build/bin/kiln-run train $OUT/gpt2.kpack --steps 50 --eval-interval 0 --quiet \
  --profile --threads 1 --checkpoint $OUT/profile.ckpt --stats-csv $OUT/stats.csv > $OUT/profile.txt
"${MPIRUN[@]}" build/bin/kiln-comm-bench --sizes 1,4,16 --json > $OUT/allreduce.json
python3 - "$OUT" "$ROUNDS" <<'PY'
import csv, json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def kiln(name):
    ms = []
    for r in range(1, rounds + 1):
        ms += [float(m) for m in re.findall(r"\| ([0-9.]+) ms/step", open(f"{out}/{name}.{r}.log").read())][10:]
    return statistics.median(ms)
dp, one = kiln("kiln-2x1"), kiln("kiln-1x2")
dpt, half = kiln("kiln-2x1-inline"), kiln("kiln-1x1-b12")
def ddp_ms(name):
    return statistics.median(json.loads(open(f"{out}/{name}.{r}.json").read().splitlines()[-1])["ms_median"]
                             for r in range(1, rounds + 1))
ddp = ddp_ms("ddp")
dpb, ddpb = kiln("kiln-2x1-bf16"), ddp_ms("ddp-bf16")
print("nanoGPT CPU config, global batch 24 (12 per rank), median ms/step:")
print(f"  Kiln, 2 ranks x 1 thread (mpirun):        {dp:8.2f}")
print(f"  PyTorch DDP (gloo), 2 ranks x 1 thread:   {ddp:8.2f}")
print(f"  Kiln speedup over DDP: {ddp / dp:.2f}x (target >= 1.5x)")
print(f"  Kiln, 1 rank x 2 threads (batch 24):      {one:8.2f}  ({one / dp:.2f}x the 2-rank time)")
print(f"  Kiln, 2 ranks x 1 thread, no communication thread (KILN_COMM_THREAD=off): {dpt:8.2f}")
print(f"  Kiln, 1 device x 1 thread at the per-rank batch (12): {half:8.2f}  "
      f"(the 2-rank step costs {dp - half:.2f} ms more)")
prof = open(f"{out}/profile.txt").read()
steps = int(re.search(r"profile of steps \d+\.\.\d+ \((\d+) steps", prof).group(1))
rows = list(csv.DictReader(open(f"{out}/stats.csv", newline="")))
run = sum(float(r["total_s"]) for r in rows if r["kind"] == "collective")
wait = sum(float(r["total_s"]) for r in rows if r["kind"] == "collective wait")
print(f"  Kiln's communication per step (rank 0, {steps} profiled steps): {run / steps * 1e3:.2f} ms in "
      f"collectives, {wait / steps * 1e3:.2f} ms exposed (not overlapped)")
print("mixed precision on both sides (bf16 compute, fp32 master weights), 2 ranks x 1 thread:")
print(f"  Kiln --precision bf16:                    {dpb:8.2f}")
print(f"  PyTorch DDP + autocast bf16:              {ddpb:8.2f}")
print(f"  Kiln speedup over DDP in bf16: {ddpb / dpb:.2f}x (not the target: that is fp32 against fp32)")
print("all_reduce of f32, 2 ranks (kiln-comm-bench):")
for line in open(f"{out}/allreduce.json"):
    line = line.strip()
    if line.startswith("{"):
        print("  " + line)
PY
