#!/bin/sh
# The MPI communicator end to end (ctest runs this with the test binary and
# a world size): every op checked on N processes, the same bits as N
# in-process ranks, and a stalled rank ending the job within the deadline.
# Every mpirun is guarded by `timeout -k 5 60` (KILL 5 s after TERM, which
# a wedged mpirun may ignore), so the test itself never hangs.
set -u
bin=$1
n=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun="timeout -k 5 60 mpirun --oversubscribe -np $n"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

$mpirun "$bin" sequence >"$tmp/mpi.out" 2>"$tmp/mpi.err" || {
  echo "FAIL: mpirun -np $n sequence exited $?"; cat "$tmp/mpi.out" "$tmp/mpi.err"; exit 1; }
"$bin" in-process "$n" >"$tmp/inproc.out" 2>&1 || {
  echo "FAIL: in-process $n"; cat "$tmp/inproc.out"; exit 1; }
sort "$tmp/mpi.out" >"$tmp/mpi.sorted"
if [ "$(wc -l <"$tmp/mpi.sorted")" -ne "$n" ] || ! cmp -s "$tmp/mpi.sorted" "$tmp/inproc.out"; then
  echo "FAIL: MPI and in-process results differ"; echo "mpi:"; cat "$tmp/mpi.sorted"
  echo "in-process:"; cat "$tmp/inproc.out"; exit 1
fi
echo "same bits, $n ranks:"; cat "$tmp/mpi.sorted"

# A rank that stalls past the deadline: the job ends soon after 1 s (rank 1
# would sleep 30 s), nonzero, with the message naming rank, op and context.
start=$(date +%s)
$mpirun "$bin" stall 30 >"$tmp/stall.out" 2>"$tmp/stall.err"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$took" -gt 20 ]; then
  echo "FAIL: stalled rank: rc $rc after ${took} s"; cat "$tmp/stall.out" "$tmp/stall.err"; exit 1
fi
if ! grep -q "rank 0: all_reduce (sum, 4096 x f32) at step 3, bucket 1 timed out after 1 s: rank(s) 1 did not take part" "$tmp/stall.err"; then
  echo "FAIL: no timeout message naming rank 0, the op and the context"; cat "$tmp/stall.err"; exit 1
fi
echo "stalled rank 1: the job ended in ${took} s with rc $rc"

# The same stall where the collective's group [1, 0] needs a communicator
# of its own first (MPI_Comm_create_group, which has no deadline): the
# members meet under the deadline before it, and the timeout names the call.
start=$(date +%s)
$mpirun "$bin" stall-group 30 >"$tmp/sg.out" 2>"$tmp/sg.err"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$took" -gt 20 ]; then
  echo "FAIL: stalled rank at group creation: rc $rc after ${took} s"; cat "$tmp/sg.out" "$tmp/sg.err"; exit 1
fi
if ! grep -q "rank 0: all_reduce (sum, 16 x f32) (creating the communicator of ranks \[1, 0\]: MPI_Comm_create_group) at step 1 timed out after 1 s: rank(s) 1 did not take part" "$tmp/sg.err"; then
  echo "FAIL: no timeout message naming rank 0, the group creation and rank 1"; cat "$tmp/sg.err"; exit 1
fi
echo "stalled rank 1 at group creation: the job ended in ${took} s with rc $rc"

# A rank that exits without a word, and one killed: the job ends, nonzero,
# no hang.
for how in exit kill; do
  start=$(date +%s)
  $mpirun "$bin" $how >"$tmp/$how.out" 2>"$tmp/$how.err"
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || [ "$took" -gt 20 ]; then
    echo "FAIL: rank 1 $how: rc $rc after ${took} s"; cat "$tmp/$how.out" "$tmp/$how.err"; exit 1
  fi
  if grep -q "the all_reduce returned" "$tmp/$how.out"; then
    echo "FAIL: rank 1 $how: a surviving rank's all_reduce returned"; cat "$tmp/$how.out"; exit 1
  fi
  echo "rank 1 $how: the job ended in ${took} s with rc $rc"
done

# Launcher variables that MPI does not confirm: refused before any collective.
if RANK=1 WORLD_SIZE=4 timeout 60 "$bin" sequence >"$tmp/env.out" 2>&1; then
  echo "FAIL: torchrun-style variables for 4 ranks in a world of 1 were accepted"; exit 1
fi
if ! grep -q "say rank 1 of 4, but MPI reports rank 0 of 1" "$tmp/env.out"; then
  echo "FAIL: no launcher mismatch message"; cat "$tmp/env.out"; exit 1
fi
echo "launcher mismatch refused"
