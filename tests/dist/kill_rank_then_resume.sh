#!/usr/bin/env bash
# A rank killed mid-training ends the whole job, and relaunching the same command resumes
# from the last complete checkpoint. Runs the real `loom train` under mpirun on 2 ranks.
# Usage: kill_rank_then_resume.sh <mpiexec> <path to loom>
set -u
mpiexec=${1:?usage: kill_rank_then_resume.sh <mpiexec> <loom>}
loom=${2:?usage: kill_rank_then_resume.sh <mpiexec> <loom>}
source "$(dirname "$0")/lib.sh"
test_workdir kill_rank_then_resume 100000
write_token_shard "$dir/train_000000.bin" 11
cat > "$dir/tiny.toml" <<TOML
$(tiny_model_toml)
[train]
batch_size = 2
seq_len = 16
steps = 1000000
threads = 1
[checkpoint]
dir = "$dir/ckpt"
every = 5
keep_last = 2
[log]
dir = "$dir/run"
every = 1000
TOML

export OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=20
"$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$loom" train "$dir/tiny.toml" >"$dir/first.log" 2>&1 &
job=$!
for _ in $(seq 600); do  # wait (up to 60 s) for a checkpoint past step 10
  latest=$(cat "$dir/ckpt/latest" 2>/dev/null || true)
  [ -n "$latest" ] && [ "${latest#step_}" -ge 10 ] 2>/dev/null && break
  sleep 0.1
done
[ -n "${latest:-}" ] || fail "no checkpoint appeared"
victim=$(pgrep -f "^$loom train $dir/tiny.toml" | tail -n 1)  # a rank, not mpirun
[ -n "$victim" ] || fail "no rank process found"
kill -9 "$victim"
start=$(date +%s)
wait "$job"
rc=$?
elapsed_s=$(($(date +%s) - start))
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
[ "$elapsed_s" -le 40 ] || fail "the job took ${elapsed_s} s to end after the kill"

# Relaunch the same command (with a reachable end): it resumes from the newest checkpoint.
resume_from=$(cat "$dir/ckpt/latest")
step=${resume_from#step_}
step=$((10#$step))
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$loom" train "$dir/tiny.toml" \
  --train.steps=$((step + 3)) >"$dir/second.log" 2>&1 || fail "the relaunched job failed"
grep -q "resumed from .*$resume_from at step $step" "$dir/second.log" || fail "the relaunch did not resume from $resume_from"
[ "$(cat "$dir/ckpt/latest")" = "$(printf 'step_%08d' $((step + 3)))" ] || fail "the relaunch did not reach step $((step + 3))"
echo "kill_rank_then_resume: killed rank pid $victim after $resume_from; job ended in ${elapsed_s} s (exit $rc); relaunch resumed at step $step and finished"
