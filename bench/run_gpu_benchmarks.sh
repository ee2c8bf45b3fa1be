#!/usr/bin/env bash
# The GPU benchmark (issue 6), for a machine with one NVIDIA GPU: the CUDA kernel tests, then
# loom, PyTorch (eager and torch.compile, BF16 autocast) and llm.c (where built) side by side in
# the same run on GPT-2 124M and a 1B Llama-style model at sequence 1024 (and the 1B at 4096), BF16 with fp32 master
# weights.
# Prints the GPU, driver and a Markdown table; JSON lands in $OUT.
#   bash bench/run_gpu_benchmarks.sh            (from the repository root, after a CUDA build)
set -euo pipefail
BUILD=${LOOM_BUILD_DIR:-build}
OUT=${BENCH_OUT:-bench/results/gpu}
STEPS=${STEPS:-20}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.csv"
ctest --test-dir "$BUILD" -L gpu --output-on-failure | tail -5

# Random GPT-2-vocabulary tokens in llm.c's shard format (loom's data loader reads them).
DATA=$(mktemp -d)
/usr/bin/python3 - "$DATA" <<'PY'
import struct, sys, random
random.seed(0)
tokens = [random.randrange(50257) for _ in range(4_000_000)]
header = [20240520, 1, len(tokens)] + [0] * 253
with open(f"{sys.argv[1]}/bench_train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY

run_loom() {  # preset batch [precision [attention kernels [seq]]]
  local precision=${3:-bf16} attention=${4:-auto} seq=${5:-1024} name="$1_${3:-bf16}_${4:-auto}"
  [ "$seq" != 1024 ] && name="${name}_seq$seq"
  cat > "$DATA/$name.toml" <<TOML
[model]
preset = "$1"
max_seq_len = $seq
[data]
train = "$DATA/bench_train_*.bin"
[train]
batch_size = $2
seq_len = $seq
steps = $STEPS
precision = "$precision"
device = "cuda"
[optim]
warmup_steps = 0
[log]
dir = "$OUT/loom_$name"
TOML
  LOOM_CUDA_ATTENTION="$attention" "$BUILD/loom" train "$DATA/$name.toml" > "$OUT/loom_$name.log"
  /usr/bin/python3 - "$OUT/loom_$name/metrics.jsonl" "$1" "$2" "$precision" "$attention" "$seq" <<'PY' | tee "$OUT/loom_$name.json"
import json, sys, statistics
records = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"][5:]  # after warm-up
ms = statistics.median(r["step_ms"] for r in records)
memory = max((r["memory_bytes"] or 0) for r in records) / 2 ** 30  # the trainer's device peak
seq = int(sys.argv[6])
print(json.dumps({"engine": "loom", "preset": sys.argv[2], "batch": int(sys.argv[3]), "seq": seq,
                  "precision": sys.argv[4], "attention": sys.argv[5], "ms_per_step": ms, "tokens_per_s": int(sys.argv[3]) * seq / ms * 1e3,
                  "peak_memory_gib": memory}))
PY
}

for case in "gpt2-124m 16" "llama-1b 4"; do
  set -- $case
  run_loom "$1" "$2"
  /usr/bin/python3 bench/torch_gpu_train_step.py --preset "$1" --batch "$2" --seq 1024 --steps "$STEPS" \
    | tee "$OUT/torch_eager_$1.json"
  /usr/bin/python3 bench/torch_gpu_train_step.py --preset "$1" --batch "$2" --seq 1024 --steps "$STEPS" --compile \
    | tee "$OUT/torch_compile_$1.json"
done
# llm.c, the third reference, on the GPT-2 case where its trainer was built
# (tools/device/build_llmc.sh; LLMC_BIN names another build).
LLMC_BIN=${LLMC_BIN:-.device/llmc/train_gpt2cu}
if [ -x "$LLMC_BIN" ]; then
  bash bench/llmc_gpu.sh "$LLMC_BIN" "$DATA/llmc" "$STEPS" 16 > "$OUT/llmc_gpt2-124m.log" 2>&1 ||
    echo "llm.c failed: see $OUT/llmc_gpt2-124m.log"
  grep '^{' "$OUT/llmc_gpt2-124m.log" | tee "$OUT/llmc_gpt2-124m.json" || true
fi
# What the tensor-core attention and FP8 GEMMs each buy, on the same machine in the same run.
run_loom gpt2-124m 16 bf16 scalar
run_loom gpt2-124m 16 bf16 pipelined
run_loom llama-1b 4 bf16 pipelined
run_loom gpt2-124m 16 bf16 cudnn
run_loom llama-1b 4 bf16 cudnn
run_loom llama-1b 4 fp8
run_loom gpt2-124m 16 fp8
# The ~1B model at sequence 4096: one sequence a step (4096 tokens, as 4 x 1024), bf16 and fp8,
# against torch.compile.
run_loom llama-1b 1 bf16 auto 4096
run_loom llama-1b 1 fp8 auto 4096
/usr/bin/python3 bench/torch_gpu_train_step.py --preset llama-1b --batch 1 --seq 4096 --steps "$STEPS" --compile \
  | tee "$OUT/torch_compile_llama-1b_seq4096.json"
rm -rf "$DATA"

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print("\n| model | engine | ms/step | tokens/s | vs PyTorch best | MFU (datasheet) | MFU (measured GEMM) | peak memory GiB |")
print("|---|---|---|---|---|---|---|---|")
for preset in ["gpt2-124m", "llama-1b"]:
    eager = json.load(open(os.path.join(out, f"torch_eager_{preset}.json")))
    comp = json.load(open(os.path.join(out, f"torch_compile_{preset}.json")))
    loom = json.load(open(os.path.join(out, f"loom_{preset}_bf16_auto.json")))
    best = max(eager["tokens_per_s"], comp["tokens_per_s"])
    flops_per_token = eager["model_tflops"] * 1e12 / eager["tokens_per_s"]  # same model, same formula
    rows = [("loom", loom), ("PyTorch eager", eager), ("PyTorch compile", comp)]
    llmc = os.path.join(out, f"llmc_{preset}.json")
    if os.path.exists(llmc) and os.path.getsize(llmc) > 0:
        rows.append(("llm.c", json.load(open(llmc))))
    for name, d in rows:
        tflops = flops_per_token * d["tokens_per_s"] / 1e12
        mfu = tflops / (eager["model_tflops"] / eager["mfu_vs_datasheet"])
        mfu_gemm = tflops / eager["measured_bf16_gemm_tflops"]
        mem = d.get("peak_memory_gib", float("nan"))
        print(f"| {preset} | {name} | {d['ms_per_step']:.1f} | {d['tokens_per_s']:.0f} | "
              f"{d['tokens_per_s']/best:.2f}x | {100*mfu:.1f}% | {100*mfu_gemm:.1f}% | {mem:.1f} |")
PY

# loom's own ablations against its default (bf16, tensor-core attention), same run.
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("\n| model | loom precision | attention kernels | ms/step | tokens/s | vs loom bf16 |")
print("|---|---|---|---|---|---|")
for preset in ["gpt2-124m", "llama-1b"]:
    base = json.load(open(os.path.join(out, f"loom_{preset}_bf16_auto.json")))
    for precision, attention in [("bf16", "auto"), ("bf16", "scalar"), ("bf16", "pipelined"),
                                 ("bf16", "cudnn"), ("fp8", "auto")]:
        path = os.path.join(out, f"loom_{preset}_{precision}_{attention}.json")
        if not os.path.exists(path):
            continue
        d = json.load(open(path))
        print(f"| {preset} | {precision} | {attention} | {d['ms_per_step']:.1f} | "
              f"{d['tokens_per_s']:.0f} | {d['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
PY

# The ~1B model at sequence 4096.
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
paths = {"loom bf16": "loom_llama-1b_bf16_auto_seq4096.json", "loom fp8": "loom_llama-1b_fp8_auto_seq4096.json",
         "PyTorch compile": "torch_compile_llama-1b_seq4096.json"}
rows = {k: json.load(open(os.path.join(out, v))) for k, v in paths.items() if os.path.exists(os.path.join(out, v))}
if "PyTorch compile" in rows:
    base = rows["PyTorch compile"]["tokens_per_s"]
    print("\n| llama-1b, 1 x 4096 | ms/step | tokens/s | vs torch.compile |")
    print("|---|---|---|---|")
    for name, d in rows.items():
        print(f"| {name} | {d['ms_per_step']:.1f} | {d['tokens_per_s']:.0f} | {d['tokens_per_s'] / base:.2f}x |")
PY
