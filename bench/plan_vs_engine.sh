#!/usr/bin/env bash
# The planner against loom's own engine on this machine: `loom calibrate` measures the machine
# at 1, 2 and 4 ranks into a profile; then each layout below trains a GPT-2-style model (8
# layers, d = 256, 4 heads, a 2048-token vocabulary, 32 sequences of 128 tokens per step), or
# for the last seven a mixture of experts (model_moe), for STEPS steps under mpirun, and `loom plan --layout ... --profile` predicts its step time
# and memory. Prints predicted vs measured side by side, and the median and worst
# |predicted / measured - 1|, and writes the same as JSON to $OUT/plan_vs_engine.json.
# Measured is the median step after two warm-up steps, as calibrate keeps the median of each
# kernel's timed rounds: both sides then see the machine at its typical speed, whatever other
# tenants of these cores do (bench/README.md); the fastest step is kept in the JSON too.
# The last nine train in FP8 (each recipe; the CPU's emulation), predicted with --precision fp8.
# Usage: bench/plan_vs_engine.sh [build dir] (default build-cpu); STEPS (default 8),
# PROFILE (reuse a profile instead of calibrating), OUT (default bench/results), ONLY (a regular
# expression: run only the layouts whose names match).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cpu}
loom=$build/loom
steps=${STEPS:-8}
out=${OUT:-bench/results}
mkdir -p "$out"
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)

profile=${PROFILE:-$out/machine_profile.json}
if [ -z "${PROFILE:-}" ]; then
  rm -f "$profile"
  for n in 1 2 4; do "${mpi[@]}" -np $n "$loom" calibrate --out "$profile"; done
fi

/usr/bin/python3 - "$work/train_000000.bin" <<'PY'
import random, struct, sys
rng = random.Random(3)
tokens = [rng.randrange(2048) for i in range(400000)]
header = [20240520, 1, len(tokens)] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY

# name | ranks | layout (the [parallel] table's layout key and plan --layout) | grad_accum
layouts=(
  "one rank|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none|8"
  "dp2|2|tp=1 pp=1 dp=2 zero=0 mbs=4 recompute=none|4"
  "dp2 zero1|2|tp=1 pp=1 dp=2 zero=1 mbs=4 recompute=none|4"
  "dp2 zero2|2|tp=1 pp=1 dp=2 zero=2 mbs=4 recompute=none|4"
  "dp2 zero3|2|tp=1 pp=1 dp=2 zero=3 mbs=4 recompute=none|4"
  "tp2|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none|8"
  "tp2 sp|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none sp|8"
  "pp2 afab|2|tp=1 pp=2 dp=1 zero=0 mbs=4 recompute=none afab|8"
  "pp2 1f1b|2|tp=1 pp=2 dp=1 zero=0 mbs=4 recompute=none 1f1b|8"
  "pp2 interleaved|2|tp=1 pp=2 v=2 dp=1 zero=0 mbs=4 recompute=none interleaved|8"
  "pp2 zbh1|2|tp=1 pp=2 dp=1 zero=0 mbs=4 recompute=none zbh1|8"
  "pp2 zbv|2|tp=1 pp=2 v=2 dp=1 zero=0 mbs=4 recompute=none zbv|8"
  "pp2 dualpipev|2|tp=1 pp=2 v=2 dp=1 zero=0 mbs=4 recompute=none dualpipev|8"
  "cp2 ring|2|tp=1 pp=1 dp=1 cp=2 zero=0 mbs=4 recompute=none|8"
  "one rank, full recompute|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=full|8"
  "dp2 x tp2|4|tp=2 pp=1 dp=2 zero=0 mbs=4 recompute=none|4"
  "pp2 x dp2 zero1|4|tp=1 pp=2 dp=2 zero=1 mbs=4 recompute=none 1f1b|4"
  "dp4 zero1|4|tp=1 pp=1 dp=4 zero=1 mbs=4 recompute=none|2"
  # A mixture of experts (model_moe below): one process, experts spread over 2 ranks, and
  # ep2 inside dp4 with ZeRO-1 and ZeRO-3, ep2 over the two ranks of cp2, and tp2 with and
  # without sequence parallelism (the experts whole on both tp ranks).
  "moe one rank|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|moe"
  "moe ep2|2|tp=1 pp=1 dp=2 ep=2 zero=0 mbs=4 recompute=none|4|moe"
  "moe dp4 ep2 zero1|4|tp=1 pp=1 dp=4 ep=2 zero=1 mbs=4 recompute=none|2|moe"
  "moe dp4 ep2 zero3|4|tp=1 pp=1 dp=4 ep=2 zero=3 mbs=4 recompute=none|2|moe"
  "moe cp2 ep2|2|tp=1 pp=1 dp=1 cp=2 ep=2 zero=0 mbs=4 recompute=none|8|moe"
  "moe tp2|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|moe"
  "moe tp2 sp|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none sp|8|moe"
  # FP8 (train.precision = "fp8", the CPU's emulation: the f32 GEMMs on operands quantised to
  # FP8 and back; `loom plan --precision fp8 --fp8-recipe R`): each recipe in one process, the
  # current recipe's per-quantisation amax all-reduces under dp and tp, blockwise under pp, and
  # the experts' own quantisations under ep.
  "fp8 one rank|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|gpt2|delayed"
  "fp8 current one rank|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|gpt2|current"
  "fp8 blockwise one rank|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|gpt2|blockwise"
  "fp8 current dp2 zero1|2|tp=1 pp=1 dp=2 zero=1 mbs=4 recompute=none|4|gpt2|current"
  "fp8 tp2 sp|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none sp|8|gpt2|delayed"
  "fp8 current tp2|2|tp=2 pp=1 dp=1 zero=0 mbs=4 recompute=none|8|gpt2|current"
  "fp8 blockwise pp2 1f1b|2|tp=1 pp=2 dp=1 zero=0 mbs=4 recompute=none 1f1b|8|gpt2|blockwise"
  "fp8 full recompute|1|tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=full|8|gpt2|delayed"
  "fp8 moe ep2|2|tp=1 pp=1 dp=2 ep=2 zero=0 mbs=4 recompute=none|4|moe|delayed"
)

# The layouts' model: GPT-2 8 x 256 (above), or a Llama-style mixture of experts, 4 layers of
# d = 256 with 4 SwiGLU experts of 256 and every token routed to all four (k = E). That keeps
# the experts' load balanced by construction: which rows a rank's experts receive is the
# router's doing, an input the planner takes (--moe-imbalance, 1 here) rather than predicts.
model_gpt2='arch = "gpt2"
vocab_size = 2048
max_seq_len = 128
n_layer = 8
n_embd = 256
n_head = 4'
model_moe='arch = "llama"
vocab_size = 2048
max_seq_len = 128
n_layer = 4
n_embd = 256
n_head = 4
n_kv_head = 4
ffn_hidden = 256
n_experts = 4
experts_per_token = 4'

results="$work/results.jsonl"
: >"$results"
for row in "${layouts[@]}"; do
  IFS='|' read -r name ranks layout accum model recipe <<<"$row"
  [ "${model:-gpt2}" = moe ] && model_toml=$model_moe || model_toml=$model_gpt2
  precision_toml="" plan_precision=()
  if [ -n "${recipe:-}" ]; then
    precision_toml="precision = \"fp8\"
fp8_recipe = \"$recipe\""
    plan_precision=(--precision fp8 --fp8-recipe "$recipe")
  fi
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || continue
  run="$work/run$(wc -l <"$results")"
  mkdir -p "$run"
  cat >"$run/config.toml" <<TOML
[model]
$model_toml
[data]
train = "$work/train_*.bin"
[train]
batch_size = 4
seq_len = 128
grad_accum = $accum
steps = $steps
threads = 1
$precision_toml
[eval]
every = 0
[log]
dir = "$run/log"
every = 1
[parallel]
layout = "$layout"
TOML
  if [ "$ranks" = 1 ]; then "$loom" train "$run/config.toml" >"$run/train.log" 2>&1
  else "${mpi[@]}" -np "$ranks" "$loom" train "$run/config.toml" >"$run/train.log" 2>&1; fi \
    || { echo "plan_vs_engine: $name failed:"; tail -20 "$run/train.log"; exit 1; }
  "$loom" plan --model "$run/config.toml" --layout "$layout" --profile "$profile" --seq 128 --global-batch 32 \
    "${plan_precision[@]}" --json >"$run/plan.json" || { echo "plan_vs_engine: loom plan failed for $name"; cat "$run/plan.json"; exit 1; }
  /usr/bin/python3 - "$name" "$ranks" "$layout" "$run" >>"$results" <<'PY'
import json, statistics, sys
name, ranks, layout, run = sys.argv[1:5]
records = [json.loads(l) for l in open(f"{run}/log/metrics.jsonl")]
train = [r for r in records if r.get("kind") == "train"]
times = [r["step_ms"] / 1000 for r in train[2:]]  # steps 1-2 warm the caches and allocator
memory = [r["memory_bytes"] for r in train if r.get("memory_bytes") is not None]
# Peak bytes per allocator category over the steps: model states and activations are what the
# planner predicts per rank (comm buffers and workspace are scratch it does not itemise).
peaks = {}
for r in train:
    for k, v in (r.get("memory_peak_bytes") or {}).items():
        peaks[k] = max(peaks.get(k, 0), v)
plan = json.load(open(f"{run}/plan.json"))
pm = plan["memory_bytes"]
states = ("parameters", "gradients", "optimizer_state")
print(json.dumps({"name": name, "ranks": int(ranks), "layout": layout,
                  "measured_step_s": statistics.median(times), "measured_fastest_s": min(times),
                  "predicted_step_s": plan["time"]["step_s"], "predicted": plan["time"],
                  "measured_memory_bytes": max(memory) if memory else None,
                  "predicted_memory_bytes": pm["total"], "memory_model": plan.get("memory_model"),
                  "measured_states_bytes": sum(peaks.get(k, 0) for k in states),
                  "predicted_states_bytes": sum(pm[k] for k in states),
                  "measured_activation_bytes": peaks.get("activations"),
                  "predicted_activation_bytes": pm["activations"], "measured_peaks": peaks}))
PY
  tail -1 "$results" | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
m, p = r["measured_step_s"], r["predicted_step_s"]
print("%-26s measured %.3f s, predicted %.3f s (%+.1f%%)" % (r["name"], m, p, 100 * (p / m - 1)), flush=True)'
done

/usr/bin/python3 - "$results" "$out/plan_vs_engine.json" "$profile" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
machine = json.load(open(sys.argv[3]))["machine"]
print(f"\n{machine}: loom plan --profile against loom train, GPT-2 8 x 256 (moe: 4 x 256, 4 experts, k = 4), 32 x 128 tokens per step\n")
print("| layout | ranks | measured s/step | predicted | error | predicted compute / comm / bubble s | model states MiB measured / predicted | activations MiB measured / predicted |")
print("|---|---|---|---|---|---|---|---|")
errors, memory_errors = [], []
for r in rows:
    e = r["predicted_step_s"] / r["measured_step_s"] - 1
    errors.append(abs(e))
    p = r["predicted"]
    def pair(measured, predicted):
        text = f"{measured / 2**20:.2f} / {predicted / 2**20:.2f}" if measured else f"- / {predicted / 2**20:.2f}"
        if measured: memory_errors.append(abs(predicted / measured - 1))
        return text + ("" if r.get("memory_model") == "engine" else " (GPU model)")
    states = pair(r["measured_states_bytes"], r["predicted_states_bytes"])
    acts = pair(r["measured_activation_bytes"], r["predicted_activation_bytes"])
    print(f"| {r['name']} | {r['ranks']} | {r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | {e:+.1%} | "
          f"{p['compute_s']:.3f} / {p['exposed_comm_s']:.3f} / {p['bubble_s']:.3f} | {states} | {acts} |")
print(f"\nmedian |predicted/measured - 1| = {statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(rows)} layouts")
if memory_errors:
    print(f"memory (model states and activations per rank): median |error| {statistics.median(memory_errors):.1%}, "
          f"worst {max(memory_errors):.1%} over {len(memory_errors)} figures")
json.dump({"machine": machine, "layouts": rows, "median_abs_error": statistics.median(errors),
           "worst_abs_error": max(errors)}, open(sys.argv[2], "w"), indent=1)
PY
