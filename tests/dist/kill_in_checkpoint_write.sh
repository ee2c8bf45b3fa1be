#!/usr/bin/env bash
# A rank killed in the middle of writing an asynchronous checkpoint (debug.kill_in_checkpoint_write)
# ends the job and leaves the previous checkpoint as `latest`; the relaunch ignores and removes
# the partial directory, resumes from the previous checkpoint and ends with files byte for byte
# equal to an uninterrupted run's. Sharded format (ZeRO-1 on 2 ranks): every rank writes a shard.
# Usage: kill_in_checkpoint_write.sh <mpiexec> <path to loom>
set -u
mpiexec=${1:?usage: kill_in_checkpoint_write.sh <mpiexec> <loom>}
loom=${2:?usage: kill_in_checkpoint_write.sh <mpiexec> <loom>}
source "$(dirname "$0")/lib.sh"
test_workdir kill_in_checkpoint_write
write_token_shard "$dir/train_000000.bin" 7
config() {  # $1: run name
  cat <<TOML
$(tiny_model_toml)
[train]
batch_size = 2
seq_len = 16
steps = 12
threads = 1
[parallel]
zero_stage = 1
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
config killed >"$dir/killed.toml"
export OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=20
mpi=("$mpiexec" --oversubscribe --allow-run-as-root -np 2)
"${mpi[@]}" "$loom" train "$dir/straight.toml" >"$dir/straight.log" 2>&1 || fail "the uninterrupted run failed"

# Rank 1 dies after writing its shard of step 8, before its done marker; the slow write keeps
# rank 0 training meanwhile, as a real background write would.
timeout 120 "${mpi[@]}" "$loom" train "$dir/killed.toml" --debug.kill_in_checkpoint_write=8 --debug.kill_rank=1 \
  --debug.slow_checkpoint_write_ms=200 >"$dir/killed.log" 2>&1 && fail "the job exited 0 after a rank was killed"
grep -q "debug.kill_in_checkpoint_write: rank 1 kills itself after writing shard-00001-of-00002.safetensors of step 8" \
  "$dir/killed.log" || fail "rank 1 did not die in the write"
[ "$(cat "$dir/killed/ckpt/latest")" = step_00000004 ] || fail "latest is $(cat "$dir/killed/ckpt/latest"), expected step_00000004"
partial=$(cd "$dir/killed/ckpt" && ls -d step_00000008.tmp-* 2>/dev/null)
[ -n "$partial" ] || fail "no partial step_00000008.tmp-* directory was left to clean up: $(ls "$dir/killed/ckpt")"
[ -e "$dir/killed/ckpt/step_00000008" ] && fail "an incomplete step_00000008 was published"

timeout 120 "${mpi[@]}" "$loom" train "$dir/killed.toml" >"$dir/resumed.log" 2>&1 || fail "the relaunched job failed"
grep -q "removed partial checkpoint .*/$partial" "$dir/resumed.log" || fail "the partial directory removal is not logged"
grep -q "resumed from .*step_00000004 at step 4" "$dir/resumed.log" || fail "the relaunch did not resume from step 4"
leftover=$(cd "$dir/killed/ckpt" && ls -d ./*.tmp-* 2>/dev/null)
[ -z "$leftover" ] || fail "partial directories remain: $leftover"
final=step_00000012
for f in "$dir/straight/ckpt/$final"/*; do
  name=$(basename "$f")
  cmp -s "$f" "$dir/killed/ckpt/$final/$name" || fail "$name differs from the uninterrupted run's"
done
echo "kill_in_checkpoint_write: PASS: $partial removed, resumed at step 4, $final equal file for file"
