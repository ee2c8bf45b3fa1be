# The dp2 x tp2 parity case both launcher tests run, sourced by them (not run on its own).
# A tiny GPT-2 trains STEPS steps on a random llm.c shard; the parallel run (dp 2 x tp 2, 2
# sequences per replica) and one process (4 sequences) see the same global batch, with AdamW,
# clipping that is active every step (so the world all-reduce of the norm matters) and a final
# checkpoint that `loom export` turns into one model.safetensors for compare_runs.py.
# Needs: $loom (the binary), $dir (an empty work directory), fail() (prints and exits 1).
source "$(dirname "${BASH_SOURCE[0]}")/../dist/lib.sh"
PARITY_STEPS=8
PARITY_TP=2
PARITY_RANKS=4  # dp 2 x tp 2
PARITY_COMPARE="$(dirname "${BASH_SOURCE[0]}")/compare_runs.py"

# Writes $dir/train_000000.bin and $dir/case.toml.
parity_prepare() {
  write_token_shard "$dir/train_000000.bin" 18
  cat >"$dir/case.toml" <<TOML
$(tiny_model_toml)
val = ""
[train]
batch_size = 4
seq_len = 16
steps = $PARITY_STEPS
threads = 1
[optim]
lr = 1e-3
eps = 1e-5
grad_clip = 0.05
[checkpoint]
every = $PARITY_STEPS
keep_last = 0
[log]
every = 1000
TOML
}

# The arguments after the binary for run NAME: `train CONFIG --key=value ...`.
parity_train_args() {  # $1: run name, $2: "parallel" or "single"
  local args=(train "$dir/case.toml" --checkpoint.dir="\"$dir/$1/ckpt\"" --log.dir="\"$dir/$1/run\"")
  [ "$2" = parallel ] && args+=(--parallel.tp=$PARITY_TP --train.batch_size=2)
  printf '%s\n' "${args[@]}"
}

# One process on the whole batch: the reference.
parity_reference() {
  local args
  mapfile -t args < <(parity_train_args single single)
  OMP_NUM_THREADS=1 "$loom" "${args[@]}" >"$dir/single.log" 2>&1 || fail "the one-process run failed"
}

# The same layout under mpirun on this one host ($1: mpiexec), the launch CI has always used:
# a launcher's run must equal it bit for bit (same ranks, same reductions in the same order).
parity_mpirun_reference() {
  local args
  mapfile -t args < <(parity_train_args mpirun parallel)
  OMP_NUM_THREADS=1 "$1" --oversubscribe --allow-run-as-root -np "$PARITY_RANKS" "$loom" "${args[@]}" \
    >"$dir/mpirun.log" 2>&1 || fail "mpirun -np $PARITY_RANKS on one host failed"
}

# Exports run $1's final checkpoint, the reference's and mpirun's, then compares them: run $1
# must have trained as dp 2 x tp 2, follow the one-process run to the dist tests' tolerances,
# and equal mpirun's run on one host (losses and exported weights byte for byte).
parity_compare() {
  local final
  final=$(printf 'step_%08d' "$PARITY_STEPS")
  grep -q "dp 2 x cp 1 x tp 2 x pp 1" "$dir/$1.log" || fail "$1 did not train as dp 2 x tp 2"
  for run in single mpirun "$1"; do
    [ -d "$dir/$run/ckpt/$final" ] || fail "$run wrote no $final checkpoint"
    "$loom" export --checkpoint "$dir/$run/ckpt/$final" --out "$dir/$run/export" >>"$dir/export.log" 2>&1 ||
      fail "loom export of $run's checkpoint failed"
  done
  /usr/bin/python3 "$PARITY_COMPARE" "$dir/single/run/metrics.jsonl" "$dir/$1/run/metrics.jsonl" \
    "$dir/single/export" "$dir/$1/export" "$PARITY_STEPS" || fail "$1 does not follow the one-process run"
  cmp -s "$dir/mpirun/export/model.safetensors" "$dir/$1/export/model.safetensors" ||
    fail "$1's final weights differ from mpirun's on one host"
  [ "$(grep -o '"loss":[^,]*' "$dir/mpirun/run/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$dir/$1/run/metrics.jsonl")" ] ||
    fail "$1's losses differ from mpirun's on one host"
  echo "parity: $1's losses and final weights equal mpirun's on one host, bit for bit"
}
