#!/bin/sh
# CPU executors on MPI ranks (ctest runs this with the test binary and a
# world size): the same bits as in-process ranks, and the start-up handshake
# refusing a rank with another artifact. Every mpirun is guarded by
# `timeout 60`, so the test itself never hangs.
set -u
bin=$1
n=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun="timeout 60 mpirun --oversubscribe -np $n"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

$mpirun "$bin" mpi >"$tmp/mpi.out" 2>"$tmp/mpi.err" || {
  echo "FAIL: mpirun -np $n mpi exited $?"; cat "$tmp/mpi.out" "$tmp/mpi.err"; exit 1; }
# The same through a communication thread per rank.
$mpirun "$bin" mpi-thread >"$tmp/mpit.out" 2>"$tmp/mpit.err" || {
  echo "FAIL: mpirun -np $n mpi-thread exited $?"; cat "$tmp/mpit.out" "$tmp/mpit.err"; exit 1; }
"$bin" in-process "$n" >"$tmp/inproc.out" 2>&1 || {
  echo "FAIL: in-process $n"; cat "$tmp/inproc.out"; exit 1; }
sort "$tmp/mpi.out" >"$tmp/mpi.sorted"
sort "$tmp/mpit.out" >"$tmp/mpit.sorted"
if [ "$(wc -l <"$tmp/mpi.sorted")" -ne "$n" ] || grep -q error "$tmp/inproc.out" ||
   ! cmp -s "$tmp/mpi.sorted" "$tmp/inproc.out" || ! cmp -s "$tmp/mpit.sorted" "$tmp/inproc.out"; then
  echo "FAIL: MPI and in-process executors differ"; echo "mpi:"; cat "$tmp/mpi.sorted"
  echo "mpi, communication thread:"; cat "$tmp/mpit.sorted"
  echo "in-process:"; cat "$tmp/inproc.out"; exit 1
fi
echo "same bits, $n ranks:"; cat "$tmp/mpi.sorted"

# Pipeline stages over "pp" (2 ranks: ["pp", 2]; 4: ["pp", 2, "dp", 2]).
if [ "$n" -eq 2 ] || [ "$n" -eq 4 ]; then
  $mpirun "$bin" pipeline >"$tmp/pp.out" 2>"$tmp/pp.err" || {
    echo "FAIL: mpirun -np $n pipeline exited $?"; cat "$tmp/pp.out" "$tmp/pp.err"; exit 1; }
  if [ "$(grep -c 'pipeline ok$' "$tmp/pp.out")" -ne "$n" ]; then
    echo "FAIL: pipeline stages over MPI"; cat "$tmp/pp.out" "$tmp/pp.err"; exit 1
  fi
  echo "pipeline stages over MPI, $n ranks: ok"
fi

$mpirun "$bin" mismatch >"$tmp/mm.out" 2>"$tmp/mm.err"
rc=$?
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  echo "FAIL: mismatched artifacts ran (rc $rc)"; cat "$tmp/mm.out" "$tmp/mm.err"; exit 1
fi
if ! grep -q "rank 0: rank 1 loaded a different artifact than rank 0 (hash artifact-b on rank 1, artifact-a on rank 0)" "$tmp/mm.err"; then
  echo "FAIL: no refusal naming the ranks and hashes"; cat "$tmp/mm.out" "$tmp/mm.err"; exit 1
fi
echo "mismatched artifact refused (rc $rc)"
