#!/usr/bin/env bash
# A hung rank must not hold the job: with LOOM_COMM_TIMEOUT_S=3, rank 0's all_reduce gives up,
# names itself, the operation and the ranks that did not reach it (asking the others, which
# answer from their own waits), and MPI_Abort ends the job. Three cases (hang_rank.cpp): a rank
# asleep outside MPI, a rank waiting in a collective on another group, and a recv whose peer
# waits in a collective (a deadlock), where the report says where the peer is.
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

# $1: mode, $2: ranks, $3: the line rank 0 must print.
run_case() {
  start=$(date +%s)
  LOOM_COMM_TIMEOUT_S=$timeout_s OMP_NUM_THREADS=1 timeout "$safety_net_s" \
    "$mpiexec" --oversubscribe --allow-run-as-root -np "$2" -x LOOM_COMM_TIMEOUT_S "$hang_rank" "$1" >"$log" 2>&1
  rc=$?
  elapsed_s=$(($(date +%s) - start))
  [ "$rc" -ne 124 ] || fail "$1: the job was still running after ${safety_net_s} s"
  [ "$rc" -ne 0 ] || fail "$1: the job exited 0"
  [ "$elapsed_s" -le "$allowed_s" ] || fail "$1: the job took ${elapsed_s} s, expected at most ${allowed_s} s"
  grep -qF "$3" "$log" || fail "$1: the output lacks: $3"
  echo "timeout_rank_dies: $1: PASS (exit status $rc after ${elapsed_s} s)"
}
# hang_rank completes 3 all-reduces on world first, so the hung one is all_reduce #4.
op="all_reduce #4 on group 'world'"
# Rank 1 sleeps outside MPI: it cannot answer, and is named.
run_case sleep 2 "loom: rank 0: $op (2 ranks) did not complete within ${timeout_s} s; rank 1 (of group 'world') did not reach all_reduce #4 (rank 1: no answer within 2 s: busy outside communication, hung or gone); aborting the job"
# Rank 2 waits in a barrier on another group; rank 1 reached the all_reduce and is not named.
run_case elsewhere 3 "loom: rank 0: $op (3 ranks) did not complete within ${timeout_s} s; rank 2 (of group 'world') did not reach all_reduce #4 (rank 2: had issued 3 collectives on the group, waiting in barrier #1 on group 'pair' (2 ranks)); aborting the job"
# A deadlock: rank 0's recv from rank 1 times out, and rank 1 says it waits in the all_reduce.
run_case p2p 2 "loom: rank 0: recv on group 'world' (2 ranks) from rank 1 (tag 5) did not complete within ${timeout_s} s; rank 1 of group 'world' is waiting in all_reduce #4 on group 'world' (2 ranks); aborting the job"
