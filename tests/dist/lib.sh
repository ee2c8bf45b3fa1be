# What the shell tests of whole `loom` runs share, sourced by them (not run on its own):
# a work directory removed on exit (kept with KEEP=1), a fail() that prints the runs' logs and
# exits 1, a random llm.c token shard, and the tiny GPT-2 they train.

# Makes $dir and the EXIT trap that removes it; fail() names the test ($1) and, for each
# $dir/*.log, prints its last $2 lines (default 40).
test_workdir() {
  test_name=$1
  test_log_lines=${2:-40}
  dir=$(mktemp -d)
  trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
}

# (A script with its own fail(), defined before it sources this file, keeps it.)
if ! declare -F fail >/dev/null; then
  fail() {
    echo "$test_name: FAIL: $*"
    for f in "$dir"/*.log; do
      [ -e "$f" ] || continue
      echo "--- $f ---"
      tail -n "$test_log_lines" "$f"
    done
    exit 1
  }
fi

# An llm.c token shard (header 20240520, version 1) of 20,000 tokens below 64 from seed $2,
# written to $1.
write_token_shard() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "could not write the token shard $1"
import random, struct, sys
rng = random.Random(int(sys.argv[2]))
tokens = [rng.randrange(64) for i in range(20000)]
header = [20240520, 1, len(tokens)] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
}

# The [model] and [data] tables of the tiny model (2 layers of 32, vocabulary 64, 16 tokens;
# GPT-2 unless $1 names another arch) reading $dir/train_*.bin.
tiny_model_toml() {
  cat <<TOML
[model]
arch = "${1:-gpt2}"
vocab_size = 64
max_seq_len = 16
n_layer = 2
n_embd = 32
n_head = 4
[data]
train = "$dir/train_*.bin"
TOML
}
