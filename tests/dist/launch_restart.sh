#!/usr/bin/env bash
# `loom launch` lives through a lost rank: a random rank SIGKILLs itself at a random step of a
# dp2 run (debug.kill_at_step, first attempt only); the launcher relaunches the mpirun command,
# the run resumes from its newest checkpoint, and its final checkpoint is byte for byte the one
# an uninterrupted run writes. A run that fails before training starts is not relaunched.
# Usage: launch_restart.sh <mpiexec> <path to loom> [seed]
set -u
mpiexec=${1:?usage: launch_restart.sh <mpiexec> <loom> [seed]}
loom=${2:?usage: launch_restart.sh <mpiexec> <loom> [seed]}
seed=${3:-$(( $(date +%s) % 100000 ))}
source "$(dirname "$0")/lib.sh"
test_workdir "launch_restart (seed $seed)"
write_token_shard "$dir/train_000000.bin" 5
config() {  # $1: run name
  cat <<TOML
$(tiny_model_toml)
[train]
batch_size = 2
seq_len = 16
steps = 20
threads = 1
[checkpoint]
dir = "$dir/$1/ckpt"
every = 4
keep_last = 0
[log]
dir = "$dir/$1/run"
every = 1000
TOML
}
config straight >"$dir/straight.toml"
config launched >"$dir/launched.toml"
RANDOM=$seed
rank=$(( RANDOM % 2 ))
# 9..19: after the second save (step 8), which waits for the first (step 4) to be written and
# committed, so some checkpoint is committed whatever the disk's speed; before the last step.
# (A kill before any commit restarts from step 0, also equal at the end, but resumes nothing.)
step=$(( 9 + RANDOM % 11 ))
echo "launch_restart: seed $seed: rank $rank dies at step $step"

export OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=30
mpi=("$mpiexec" --oversubscribe --allow-run-as-root -np 2)
"${mpi[@]}" "$loom" train "$dir/straight.toml" >"$dir/straight.log" 2>&1 || fail "the uninterrupted run failed"
"$loom" launch --max-restarts 2 --backoff 0.2 -- "${mpi[@]}" "$loom" train "$dir/launched.toml" \
  --debug.kill_at_step="$step" --debug.kill_rank="$rank" >"$dir/launched.log" 2>&1 || fail "loom launch exited with $?"
grep -q "loom launch: attempt 1 of 3" "$dir/launched.log" || fail "no first attempt logged"
grep -q "loom launch: attempt 1 failed after .*: exit code\|loom launch: attempt 1 failed after .*: killed by signal" \
  "$dir/launched.log" || fail "the failure is not logged"
grep -q "loom launch: attempt 2 succeeded" "$dir/launched.log" || fail "the relaunch did not succeed"
[ "$(grep -c "failed after" "$dir/launched.log")" -eq 1 ] || fail "more than one failure"
grep -q "resumed from .*step_" "$dir/launched.log" || fail "the relaunch did not resume from a checkpoint"

final=step_00000020
[ -d "$dir/straight/ckpt/$final" ] && [ -d "$dir/launched/ckpt/$final" ] || fail "a final checkpoint is missing"
for f in "$dir/straight/ckpt/$final"/*; do
  name=$(basename "$f")
  cmp -s "$f" "$dir/launched/ckpt/$final/$name" || fail "$name differs from the uninterrupted run's"
done
echo "launch_restart: the relaunched run's $final equals the uninterrupted run's, file for file"

# A run that cannot start (no shards) fails the same way every time: one attempt, no relaunch.
sed "s|train = \"$dir/train_\*.bin\"|train = \"$dir/missing_*.bin\"|" "$dir/straight.toml" >"$dir/broken.toml"
"$loom" launch --max-restarts 3 --backoff 0 -- "$loom" train "$dir/broken.toml" >"$dir/broken.log" 2>&1
code=$?
[ "$code" -eq 2 ] || fail "a setup failure should end loom launch with its exit code 2, got $code"
grep -q "not relaunching: the run failed before its first training step" "$dir/broken.log" || fail "a setup failure was relaunched"
grep -q "rank 0: .*no token shards match" "$dir/broken.log" || fail "the rank's error is not named"
[ "$(grep -c "attempt .* of 4:" "$dir/broken.log")" -eq 1 ] || fail "a setup failure was attempted twice"
echo "launch_restart: PASS"
