#!/usr/bin/env bash
# Asynchronous against synchronous checkpoints, on one `loom train` process and one disk:
# the milliseconds a save blocks training (metrics.jsonl "checkpoint" records, blocked_ms),
# and the write throughput of a checkpoint against the disk's own, measured in the same run
# by writing and fsyncing the same byte count in one file (what `dd conv=fsync` does).
# Usage: bench/async_checkpoint.sh <path to loom> [work dir on the disk to measure]
set -eu
loom=${1:?usage: async_checkpoint.sh <loom> [work dir]}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
trap 'rm -rf "$work"/async "$work"/sync "$work"/disk.bin' EXIT
steps=${STEPS:-8}

# 8.7M parameters (GPT-2 shape, vocab 4096, 4 layers of d = 384): a checkpoint (weights and
# two AdamW moments, f32) of about 105 MB, so that a synchronous save takes well over 50 ms.
/usr/bin/python3 - "$work/train_000000.bin" <<'PY'
import random, struct, sys
rng = random.Random(3)
tokens = [rng.randrange(4096) for i in range(60000)]
header = [20240520, 1, len(tokens)] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
config() {  # $1: run name, $2: checkpoint.async
  cat <<TOML
[model]
arch = "gpt2"
vocab_size = 4096
max_seq_len = 64
n_layer = 4
n_embd = 384
n_head = 6
[data]
train = "$work/train_*.bin"
[train]
batch_size = 2
seq_len = 64
steps = $steps
threads = 1
[checkpoint]
dir = "$work/$1/ckpt"
every = 2
keep_last = 2
async = $2
[log]
dir = "$work/$1/run"
every = 1000
TOML
}
config async true >"$work/async.toml"
config sync false >"$work/sync.toml"
export OMP_NUM_THREADS=1
"$loom" train "$work/async.toml" >"$work/async.log" 2>&1
"$loom" train "$work/sync.toml" >"$work/sync.log" 2>&1

/usr/bin/python3 - "$work" <<'PY'
import json, os, statistics, sys, time
work = sys.argv[1]
def records(run, kind):
    out = []
    for line in open(f"{work}/{run}/run/metrics.jsonl"):
        r = json.loads(line)
        if r.get("kind") == kind: out.append(r)
    return out
rows = {}
for run in ("async", "sync"):
    saves, written = records(run, "checkpoint"), records(run, "checkpoint_written")
    step_ms = statistics.median(r["step_ms"] for r in records(run, "train"))
    nbytes = written[-1]["bytes"]
    rows[run] = dict(blocked=[r["blocked_ms"] for r in saves], waited=[r["waited_ms"] for r in saves],
                     write=[r["write_ms"] for r in written], during=[r["steps_during_write"] for r in written],
                     bytes=nbytes, step_ms=step_ms)
# The disk's own rate for the same byte count: one write of it, then fsync.
nbytes = rows["sync"]["bytes"]
block = os.urandom(1 << 20)
path = f"{work}/disk.bin"
start = time.perf_counter()
with open(path, "wb") as f:
    left = nbytes
    while left > 0:
        f.write(block[:min(left, len(block))]); left -= len(block)
    f.flush(); os.fsync(f.fileno())
disk_s = time.perf_counter() - start
print(f"checkpoint {nbytes/1e6:.1f} MB; disk write+fsync of the same bytes: {disk_s*1e3:.0f} ms = {nbytes/disk_s/1e6:.0f} MB/s")
print("| mode | blocked per save ms (median, each) | of which waiting ms | write ms (median) | write MB/s | steps during a write | step ms |")
print("|---|---|---|---|---|---|---|")
for run, r in rows.items():
    w = statistics.median(r["write"])
    print(f"| {run} | {statistics.median(r['blocked']):.0f} ({', '.join(f'{b:.0f}' for b in r['blocked'])}) | "
          f"{', '.join(f'{x:.0f}' for x in r['waited'])} | {w:.0f} | {r['bytes']/w/1e3:.0f} | "
          f"{', '.join(str(d) for d in r['during'])} | {r['step_ms']:.0f} |")
PY
