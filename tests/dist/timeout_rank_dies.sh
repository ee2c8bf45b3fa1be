#!/usr/bin/env bash
# A hung rank must not hold the job: with LOOM_COMM_TIMEOUT_S=3, rank 0's all_reduce gives up,
# names itself and the operation, and MPI_Abort ends the job (rank 1 sleeps for 120 s).
# Usage: timeout_rank_dies.sh <mpiexec> <path to loom_hang_rank>
set -u
mpiexec=${1:?usage: timeout_rank_dies.sh <mpiexec> <loom_hang_rank>}
hang_rank=${2:?usage: timeout_rank_dies.sh <mpiexec> <loom_hang_rank>}
timeout_s=3
allowed_s=30      # the 3 s timeout plus MPI start-up and teardown on a loaded 2-core machine
safety_net_s=90   # if the timeout machinery is broken, do not wait for the hung rank

log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() {
  echo "timeout_rank_dies: FAIL: $*"
  echo "--- job output ---"
  cat "$log"
  exit 1
}

start=$(date +%s)
LOOM_COMM_TIMEOUT_S=$timeout_s OMP_NUM_THREADS=1 timeout "$safety_net_s" \
  "$mpiexec" --oversubscribe --allow-run-as-root -np 2 -x LOOM_COMM_TIMEOUT_S "$hang_rank" >"$log" 2>&1
rc=$?
elapsed_s=$(($(date +%s) - start))

[ "$rc" -ne 124 ] || fail "the job was still running after ${safety_net_s} s"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$elapsed_s" -le "$allowed_s" ] || fail "the job took ${elapsed_s} s, expected at most ${allowed_s} s"
expected="loom: rank 0: all_reduce on group 'world' (2 ranks) did not complete within ${timeout_s} s; aborting the job"
grep -qF "$expected" "$log" || fail "the output lacks: $expected"
echo "timeout_rank_dies: PASS (exit status $rc after ${elapsed_s} s)"
