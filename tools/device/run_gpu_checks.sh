#!/usr/bin/env bash
# The GPU checks, ON the lent device machine, from the repository root (see tools/device/README.md):
#   bash tools/device/run_gpu_checks.sh
# Unpacks .device/loom-device.tar.xz (tools/device/pack.sh) into /tmp/loomdev unless already there,
# sets the environment (tools/device/env.sh: the pack's libraries first, then the image's CUDA),
# prints nvidia-smi and `ldd loom` (stops at once if a library is not found), then, each under
# `timeout` and within one time budget (LOOM_CHECK_BUDGET_S, default 480 s), in this order:
#   1. gpu_tests   tests/gpu/loom_gpu_tests (every CUDA kernel, op, model and trainer test)
#   2. nccl_np1    mpirun -np 1 tests/gpu/nccl/loom_nccl_tests
#   3. smoke_*     mpirun -np 1 / -np 2 loom train --device cuda on a tiny GPT-2 and Llama (f32, bf16)
#  3b. calibrate   mpirun -np 1 loom calibrate --device cuda (the CUDA engine's bf16 GEMM, attention
#                  and memory-bound rates) into a machine profile, then loom plan --profile for the
#                  bench's GPT-2 124M case (bf16, 16 x 1024, one GPU); the bench's measured step
#                  is printed beside the prediction once 5. has run
#   4. layouts     ctest -L gpu -R gpu_layout (layout_on_cuda.sh: 23 MPI layouts, ranks share the
#                  GPU; the NCCL ones need 2+ GPUs and report Skipped) from the unpacked tree
#   5. bench       bench/run_gpu_benchmarks.sh's parts: loom vs PyTorch eager / torch.compile (and
#                  llm.c where .device/llmc/train_gpt2cu was built by tools/device/build_llmc.sh) on
#                  GPT-2 124M (then Llama 1B) at seq 1024, bf16, then the ablations and Llama 1B at
#                  seq 4096 (bf16, fp8, torch.compile), as long as the budget lasts
#  5c. trace       (inside 5., after the main comparison) the device timelines of loom's, llm.c's
#                  and torch.compile's GPT-2 step and loom's llama-1b bf16 / FP8 step: per kernel
#                  family, idle time host-bound or waited (tools/device/kernel_trace)
# Results go to $OUT (the device's result folder; .device/out when unset), at most 8 files:
#   summary.txt (one PASS/FAIL/SKIP/TIMEOUT line per check, read this first), env.txt,
#   gpu_tests.log, mpi_smoke.log, layouts.log, bench.log, bench.jsonl, details.tar.xz (every log,
#   gtest XML, metrics.jsonl, the calibration's gpu_profile.json and plan_gpt2_124m.json), and
#   gpu_profile.json itself where fewer than 8 files leave room for it.
set -u
REPO=$(pwd)
[ -f tools/device/env.sh ] || { echo "run from the repository root"; exit 2; }
START=$(date +%s)
BUDGET=${LOOM_CHECK_BUDGET_S:-480}
OUT=${OUT:-$REPO/.device/out}
mkdir -p "$OUT"
DEST=${LOOM_DEVICE_DIR:-/tmp/loomdev}
ARCHIVE=${LOOM_DEVICE_ARCHIVE:-$REPO/.device/loom-device.tar.xz}
W=$(mktemp -d /tmp/loomchecks.XXXX)   # detailed logs, tarred into $OUT/details.tar.xz
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
finish() {
  note "total: $(( $(date +%s) - START )) s of a ${BUDGET} s budget"
  tar -C "$W" --exclude='*.ncu-rep' --exclude='*.bin' --exclude=big --exclude='*.safetensors' --exclude=ctest --exclude='ckpt*' \
    -cJf "$OUT/details.tar.xz" . 2>/dev/null
  # The device tool brings back 8 files from $OUT: the profile joins them where there is room
  # (it is in details.tar.xz either way).
  if [ -s "$W/gpu_profile.json" ] && [ "$(find "$OUT" -type f | wc -l)" -lt 8 ]; then cp "$W/gpu_profile.json" "$OUT/"; fi
  exit "${1:-0}"
}
# check NAME TIMEOUT LOGFILE command...: runs it under timeout (cut to the budget left), one line.
check() {
  local name=$1 limit=$2 log=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then note "SKIP    $name (budget spent)"; return 0; fi
  [ "$limit" -gt "$l" ] && limit=$l
  echo "===== $name: $* (timeout ${limit}s)" >> "$log"
  local t0=$(date +%s) rc
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1; rc=$?
  local dt=$(( $(date +%s) - t0 )) word=FAIL
  case $rc in 0) word=PASS ;; 77) word=SKIP ;; 124|137) word=TIMEOUT ;; esac
  note "$(printf '%-7s %-28s rc=%-3s %4ss' "$word" "$name" "$rc" "$dt")"
  echo "===== $name: $word rc=$rc ${dt}s" >> "$log"
  return 0
}

# 0. Unpack and environment.
if [ ! -x "$DEST/loom-device/build/loom" ]; then
  [ -f "$ARCHIVE" ] || { note "FAIL    no $ARCHIVE: run tools/device/pack.sh here first and carry .device"; finish 2; }
  mkdir -p "$DEST" && tar xf "$ARCHIVE" -C "$DEST" || { note "FAIL    could not unpack $ARCHIVE"; finish 2; }
fi
P=$DEST/loom-device
# shellcheck source=env.sh
source tools/device/env.sh "$P"
# The repo's test scripts call /usr/bin/python3 (stdlib only); the bench's PyTorch side uses `python3`.
PY=$(command -v python3)
# Python (PyTorch, the stdlib helpers) runs with the image's own libraries, not the pack's.
SYSENV=(env LD_LIBRARY_PATH="$LOOM_DEVICE_ORIG_LD_LIBRARY_PATH")
[ -x /usr/bin/python3 ] || ln -s "$PY" /usr/bin/python3 2>/dev/null || true
{
  echo "date: $(date -u)"; echo "host: $(uname -a)"; cat "$P/PACK_INFO"
  echo "--- nvidia-smi"; nvidia-smi 2>&1; nvidia-smi -L 2>&1
  echo "--- python3: $PY $("${SYSENV[@]}" "$PY" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1)"
  echo "--- /usr/bin/python3: $(/usr/bin/python3 --version 2>&1)"
  echo "--- nvcc: $(nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "--- ctest: $(command -v ctest) $(ctest --version 2>&1 | head -1)"
  echo "--- LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "--- OPAL_PREFIX=$OPAL_PREFIX"
  echo "--- ldd loom"; ldd "$P/build/loom"
  echo "--- ldd loom_gpu_tests loom_nccl_tests (not found only)"
  ldd "$P/build/tests/gpu/loom_gpu_tests" "$P"/build/tests/gpu/nccl/* 2>&1 | grep 'not found'
  echo "--- mpirun --version"; mpirun --version 2>&1 | head -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
missing=$(for b in "$P/build/loom" "$P/build/tests/gpu/loom_gpu_tests" "$P"/build/tests/gpu/nccl/*; do ldd "$b"; done 2>&1 | grep 'not found' | sort -u)
if [ -n "$missing" ]; then   # look for each on this machine and put its dir on LD_LIBRARY_PATH
  for n in $(awk '{print $1}' <<<"$missing" | sort -u); do
    f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$n" -print 2>/dev/null | head -1)
    [ -n "$f" ] && { note "note    $n not on the path; using $f"; export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"; }
  done
  missing=$(for b in "$P/build/loom" "$P/build/tests/gpu/loom_gpu_tests" "$P"/build/tests/gpu/nccl/*; do ldd "$b"; done 2>&1 | grep 'not found' | sort -u)
fi
if [ -n "$missing" ]; then
  note "FAIL    libraries not found (see env.txt); nothing run:"
  note "$missing"
  for n in $(awk '{print $1}' <<<"$missing" | sort -u); do   # where this image keeps them, if anywhere
    note "        $n on this machine: $(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$n*" -print 2>/dev/null | head -5 | tr '\n' ' ')"
  done
  finish 3
fi
note "ok      every library found: $(ldd "$P/build/loom" | awk '/libcudart|libcublasLt|libnccl|libcuda\./ {print $1 "=" $3}' | tr '\n' ' ')"
# cuDNN attention's plugin (opened only for LOOM_CUDA_ATTENTION=cudnn): what it links, here.
if [ -f "$P/lib/libloom_cudnn.so" ]; then
  note "cudnn   plugin: $(ldd "$P/lib/libloom_cudnn.so" | awk '/libcudnn|libnvrtc|libcudart|not found/ {print $1 "=" $3}' | tr '\n' ' ')"
else
  note "cudnn   no libloom_cudnn.so in the pack (built without the cudnn-frontend headers)"
fi

# LOOM_CHECKS picks the phases (default all but probe, the FP8 diagnosis of 2026-11-26, and profile,
# Nsight Compute's kernel table, which trace replaces): probe tests nccl smoke calibrate layouts
# profile bench trace (trace runs inside bench, after its main comparison).
# LOOM_BENCH_TORCH=0 leaves out the PyTorch runs of the bench.
CHECKS=" ${LOOM_CHECKS:-tests nccl smoke calibrate layouts bench trace} "
want() { [[ "$CHECKS" == *" $1 "* ]]; }

# 0b. probe: which FP8 matmuls this cuBLASLt takes (.device/fp8_probe, built here from
# tools/device/fp8_probe.cu), and the FP8 tests once more under cuBLASLt's API trace.
if want probe; then
  if [ -x "$REPO/.device/fp8_probe" ]; then
    check fp8_probe 30 "$W/fp8_probe.log" "$REPO/.device/fp8_probe"
    grep -E 'found [1-9]' "$W/fp8_probe.log" | head -n 12 | sed 's/^/        /' | tee -a "$SUMMARY"
    note "        fp8_probe: $(grep -c 'found [1-9]' "$W/fp8_probe.log") of $(grep -c '^fp8_probe m=' "$W/fp8_probe.log") configurations found an algorithm"
  fi
  ( cd "$P/build/tests/gpu" && CUBLASLT_LOG_LEVEL=5 check fp8_trace 30 "$W/fp8_trace.log" \
      ./loom_gpu_tests --gtest_filter='CudaFp8Test.GemmEqualsTheDequantisedProduct' )
  grep -iE 'error|fail|not supported|heuristic' "$W/fp8_trace.log" | head -n 8 | cut -c1-400 | sed 's/^/        /' | tee -a "$SUMMARY"
fi

# 1. The CUDA unit tests: one process per test suite, 6 at a time on the one GPU, so that a
# sticky CUDA error (an illegal address) in one suite cannot fail the others.
# LOOM_GTEST_FILTER narrows them (a rerun of the failed ones).
if want tests; then
  ( cd "$P/build/tests/gpu" && OMP_NUM_THREADS=2 check gpu_tests 200 "$OUT/gpu_tests.log" \
      bash "$REPO/tools/device/gtest_suites.sh" ./loom_gpu_tests "$W/gtest" "${LOOM_GTEST_FILTER:-*}" )
  { grep -E '^suite ' "$OUT/gpu_tests.log" | grep -v 'rc=0$'
    grep -E '^\[  FAILED  \] [A-Za-z].*\(' "$OUT/gpu_tests.log"; } | sed 's/^/        /' | tee -a "$SUMMARY"
  note "        gpu tests: $(grep -c '^\[       OK \]' "$OUT/gpu_tests.log") ok, $(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$OUT/gpu_tests.log") failed, $(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$OUT/gpu_tests.log") skipped"
fi

# 2. NCCL collectives at 1 rank.
want nccl && check nccl_np1 60 "$OUT/mpi_smoke.log" mpirun --allow-run-as-root -np 1 "$P/build/tests/gpu/nccl/loom_nccl_tests"

# 3. loom train --device cuda on a tiny model, 1 and 2 ranks (2 share the GPU over MPI).
"${SYSENV[@]}" /usr/bin/python3 - "$W/data/train_000000.bin" <<'PY'
import os, random, struct, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
rng = random.Random(7)
tokens, t = [], 0
for _ in range(20000):
    t = (5 * t + 1) % 64 if rng.random() < 0.8 else rng.randrange(64)
    tokens.append(t)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
smoke() {  # name ranks arch precision
  cat > "$W/$1.toml" <<TOML
[model]
arch = "$3"
vocab_size = 64
max_seq_len = 16
n_layer = 2
n_embd = 32
n_head = 4
[data]
train = "$W/data/train_*.bin"
[train]
batch_size = 2
seq_len = 16
steps = 10
threads = 1
device = "cuda"
precision = "$4"
[checkpoint]
dir = "$W/$1/ckpt"
[log]
dir = "$W/$1"
TOML
  check "$1" 90 "$OUT/mpi_smoke.log" mpirun --allow-run-as-root -np "$2" "$P/build/loom" train "$W/$1.toml" --device cuda
}
if want smoke; then
smoke smoke_np1_gpt2_f32 1 gpt2 f32
smoke smoke_np1_llama_bf16 1 llama bf16
smoke smoke_np2_gpt2_f32 2 gpt2 f32
fi
grep -E '^(step 10/10|done:)' "$OUT/mpi_smoke.log" | sed 's/^/        /' | tee -a "$SUMMARY"

# 3b. calibrate: the CUDA engine measured into a machine profile (about 20 s), and the planner's
# predictions from it for the bench's runs (one GPU, one micro-batch: preset:batch:precision:seq,
# GPT-2 124M and llama-1b in bf16 at 1024, llama-1b at 4096; a profile is bf16), which 5. measures.
PROFILE=$W/gpu_profile.json
PLANS="gpt2-124m:16:bf16:1024 llama-1b:4:bf16:1024 llama-1b:1:bf16:4096"
if want calibrate; then
  check calibrate 120 "$W/calibrate.log" mpirun --allow-run-as-root -np 1 "$P/build/loom" calibrate --device cuda --out "$PROFILE"
  grep -E 'bf16: GEMM peak|^wrote|error' "$W/calibrate.log" | cut -c1-400 | sed 's/^/        /' | tee -a "$SUMMARY"
  [ -s "$PROFILE" ] && cp "$PROFILE" "$OUT/gpu_profile.json"
  for plan in $PLANS; do
    [ -s "$PROFILE" ] || break
    IFS=: read -r plan_preset plan_batch plan_precision plan_seq <<<"$plan"
    plan_file="$W/plan_${plan_preset}_${plan_batch}_${plan_precision}_$plan_seq.json"
    timeout 60 "$P/build/loom" plan --model "$plan_preset" --seq "$plan_seq" --global-batch "$plan_batch" \
      --precision "$plan_precision" --layout "mbs=$plan_batch" --profile "$PROFILE" --json > "$plan_file" 2>> "$W/calibrate.log"
    "${SYSENV[@]}" /usr/bin/python3 - "$plan_file" "$plan_preset" "$plan_batch" "$plan_precision $plan_batch x $plan_seq" <<'PY' | tee -a "$SUMMARY"
import json, sys
try:
    p = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"        plan --profile: no prediction ({e})"); sys.exit()
t, m = p["time"], p["memory_bytes"]
print(f"        plan --profile: {sys.argv[2]} {sys.argv[4]} on one GPU: predicted {1e3 * t['step_s']:.1f} ms/step "
      f"(compute {1e3 * t['compute_s']:.1f}, optimizer {1e3 * t['optimizer_s']:.1f}), {t['tokens_per_s']:.0f} tokens/s, "
      f"memory {m['total'] / 2**30:.2f} GiB ({'fits' if p['fits'] else 'does NOT fit'})")
PY
  done
fi

# 4. The layout tests through ctest, from the unpacked tree (paths rewritten to here).
if ! want layouts; then :
elif command -v ctest >/dev/null; then
  # shellcheck disable=SC1090
  . <(grep -E '^(build_dir|source_dir|mpiexec)=' "$P/PACK_INFO" | sed 's/^/pack_/')
  CT=$W/ctest
  rm -rf "$CT" && cp -r "$P/build" "$CT.tmp" && mkdir -p "$CT" && cp "$CT.tmp/CTestTestfile.cmake" "$CT/"
  for d in tests/gpu tests/gpu/nccl; do
    mkdir -p "$CT/$d"
    for f in "$CT.tmp/$d"/*.cmake; do
      sed -e "s#${pack_build_dir}#$P/build#g" -e "s#${pack_source_dir}/#$REPO/#g" -e "s#${pack_mpiexec}#$P/mpi/bin/mpiexec#g" "$f" > "$CT/$d/$(basename "$f")"
    done
  done
  rm -rf "$CT.tmp"
  check layouts 240 "$OUT/layouts.log" ctest --test-dir "$CT" -L gpu -R "${LOOM_LAYOUTS:-gpu_layout_}" -j 6 --output-on-failure
  grep -E 'tests passed|Passed|Failed|\*\*\*|Not Run' "$OUT/layouts.log" | sed 's/^/        /' | tail -n 25 | tee -a "$SUMMARY"
  note "        layouts: $(grep -c ' Passed ' "$OUT/layouts.log") passed, $(grep -c '\*\*\*Skipped' "$OUT/layouts.log") skipped (a NCCL layout needs 2+ GPUs), $(grep -cE '\*\*\*(Failed|Timeout|Exception)' "$OUT/layouts.log") failed"
else
  note "SKIP    layouts (no ctest on this machine)"
fi

# 5. The benchmark (bench/run_gpu_benchmarks.sh's steps, with the packed loom and python3's torch).
STEPS=${STEPS:-20}
B=$W/bench
mkdir -p "$B"
if { want bench || want trace; } && [ "$(left)" -gt 60 ]; then
  "${SYSENV[@]}" /usr/bin/python3 - "$B" <<'PY'
import struct, sys, random
random.seed(0)
tokens = [random.randrange(50257) for _ in range(4_000_000)]
with open(f"{sys.argv[1]}/bench_train_000000.bin", "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
fi
bench_toml() {  # file preset batch precision steps log_dir [seq]: a run on the bench data (seq 1024)
  cat > "$1" <<TOML
[model]
preset = "$2"
max_seq_len = ${7:-1024}
[data]
train = "$B/bench_train_*.bin"
[train]
batch_size = $3
seq_len = ${7:-1024}
steps = $5
precision = "$4"
device = "cuda"
[optim]
warmup_steps = 0
[log]
dir = "$6"
TOML
}
bench_loom() {  # preset batch [precision [attention kernels [variant: no_gelu_epilogue | nondeterministic | f32_logits | scale_per_call | blockwise [seq]]]]
  local precision=${3:-bf16} attention=${4:-auto} variant=${5:-} gelu=1 seq=${6:-1024} det=1 logits=bf16
  local name="$1_${3:-bf16}_${4:-auto}${variant:+_$variant}"
  [ "$seq" != 1024 ] && name="${name}_seq$seq"
  [ "$variant" = no_gelu_epilogue ] && gelu=0
  [ "$variant" = nondeterministic ] && det=0
  [ "$variant" = f32_logits ] && logits=f32
  local scale_per_call=0; [ "$variant" = scale_per_call ] && scale_per_call=1
  bench_toml "$B/$name.toml" "$1" "$2" "$precision" "$STEPS" "$B/loom_$name" "$seq"
  # blockwise: DeepSeek-V3's tiles on cuBLASLt's block-scaled FP8 GEMMs (train.fp8_recipe).
  [ "$variant" = blockwise ] && sed -i 's/^precision = "fp8"$/precision = "fp8"\nfp8_recipe = "blockwise"/' "$B/$name.toml"
  check "bench_loom_$name" 120 "$OUT/bench.log" env LOOM_CUDA_ATTENTION="$attention" LOOM_CUDA_GELU_EPILOGUE="$gelu" LOOM_CUDA_CUDNN_DETERMINISTIC="$det" LOOM_CUDA_LOGITS="$logits" LOOM_FP8_SCALE_PER_CALL="$scale_per_call" "$P/build/loom" train "$B/$name.toml"
  # What the run's first line says it took (the attention kernels auto chose, the logits).
  local kernels; kernels=$(grep -o 'attention: [^|]*' "$OUT/bench.log" | tail -n 1 | sed 's/ *$//')
  "${SYSENV[@]}" /usr/bin/python3 - "$B/loom_$name/metrics.jsonl" "$1" "$2" "$precision" "$attention${variant:+ $variant}" "$seq" "$kernels" >> "$OUT/bench.jsonl" 2>>"$OUT/bench.log" <<'PY'
import json, sys, statistics
records = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"][5:]
ms = statistics.median(r["step_ms"] for r in records)
memory = max((r["memory_bytes"] or 0) for r in records) / 2 ** 30
seq = int(sys.argv[6])
print(json.dumps({"engine": "loom", "preset": sys.argv[2], "batch": int(sys.argv[3]), "seq": seq,
                  "precision": sys.argv[4], "attention": sys.argv[5], "ms_per_step": ms, "tokens_per_s": int(sys.argv[3]) * seq / ms * 1e3,
                  "peak_memory_gib": memory, "kernels": sys.argv[7]}))
PY
}
bench_torch() {  # preset batch [--compile [seq]]
  [ "${LOOM_BENCH_TORCH:-1}" = 0 ] && return 0
  local tag=eager seq=${4:-1024}; [ -n "${3:-}" ] && tag=compile
  [ "$seq" != 1024 ] && tag="${tag}_seq$seq"
  check "bench_torch_${tag}_$1" 150 "$W/torch_${tag}_$1.out" "${SYSENV[@]}" "$PY" bench/torch_gpu_train_step.py --preset "$1" --batch "$2" --seq "$seq" --steps "$STEPS" ${3:-}
  cat "$W/torch_${tag}_$1.out" >> "$OUT/bench.log"
  grep '^{' "$W/torch_${tag}_$1.out" >> "$OUT/bench.jsonl"
}
# 5b. profile: Nsight Compute's duration of every kernel of 2-step runs (GPT-2 124M bf16, batch
# 16 x 1024, and llama-1b FP8, 4 x 1024, by default), summed per kernel name and per step: where
# each step's time goes.
profile_case() {  # preset batch precision tag
  local tag=$4
  bench_toml "$B/profile_$tag.toml" "$1" "$2" "$3" 2 "$B/profile_run_$tag"
  # LOOM_PROFILE_ATTENTION picks the attention kernels of the profiled run (auto by default).
  check "profile_$tag" 150 "$W/profile_$tag.log" env LOOM_CUDA_ATTENTION="${LOOM_PROFILE_ATTENTION:-auto}" ncu --clock-control none --metrics gpu__time_duration.sum \
      --csv --page raw --log-file "$W/profile_ncu_$tag.txt" -f -o "$W/profile_report_$tag" "$P/build/loom" train "$B/profile_$tag.toml"
  # LOOM_PROFILE_KERNEL=regex: Nsight Compute's full section set for one launch of that kernel.
  if [ -n "${LOOM_PROFILE_KERNEL:-}" ]; then
    check "profile_kernel_$tag" 60 "$W/profile_kernel_$tag.txt" env LOOM_CUDA_ATTENTION="${LOOM_PROFILE_ATTENTION:-auto}" ncu --clock-control none --set full -k "regex:$LOOM_PROFILE_KERNEL" \
        -s 3 -c 1 "$P/build/loom" train "$B/profile_$tag.toml"
    grep -E 'Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|L1/TEX Hit|L2 Hit|Theoretical Occupancy|Block Limit|Waves Per SM|Compute \(SM\) Throughput|uncoalesced|excessive' \
        "$W/profile_kernel_$tag.txt" | head -n 24 | cut -c1-200 | sed 's/^/        /' | tee -a "$SUMMARY"
  fi
  ncu --import "$W/profile_report_$tag.ncu-rep" --csv --page raw --print-units base --metrics gpu__time_duration.sum > "$W/profile_$tag.csv" 2>>"$W/profile_$tag.log"
  "${SYSENV[@]}" /usr/bin/python3 - "$W/profile_$tag.csv" "$tag" <<'PY' | tee -a "$SUMMARY"
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print(f"        profile {sys.argv[2]}: no kernels in the report"); sys.exit()
h = rows[head]; name_i = h.index("Kernel Name"); t_i = h.index("gpu__time_duration.sum")
total, per, count = 0.0, collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    try: t = float(r[t_i].replace(",", ""))
    except (ValueError, IndexError): continue
    name = re.sub(r"^void ", "", r[name_i].replace("<unnamed>::", ""))  # nanoseconds (--print-units base)
    name = name[:110] if name.startswith(("cutlass", "loom::pointwise")) else re.sub(r"[(<].*", "", name)
    per[name] += t; count[name] += 1; total += t
print(f"        profile {sys.argv[2]}: {sum(count.values())} kernels, {total/1e6:.1f} ms of kernel time over 2 steps; top kernel names (ms over 2 steps, launches):")
for name, t in per.most_common(25):
    print(f"          {t/1e6:8.2f} ms {100*t/total:5.1f}%  {count[name]:5d}  {name[:90]}")
PY
}
# 5c. trace: each engine's device timeline over 10 steps (tools/device/kernel_trace, CUPTI's
# activity records through CUDA_INJECTION64_PATH: these machines have no Nsight Systems, and
# Nsight Compute replays kernels one by one with the caches flushed), then per step: span, busy,
# idle (host-bound or waited), time per kernel family, top kernels, largest gaps
# (tools/device/kernel_trace_summary.py; JSON lines in trace.jsonl). loom's GPT-2 beside llm.c's
# and torch.compile's on the same case, then llama-1b in bf16 and FP8. Runs inside the bench,
# after its main comparison. The tracer adds a little to each launch: its step times are not
# the bench's.
TRACER=$P/lib/cupti/libloom_kernel_trace.so
TRACE_ENV=(env CUDA_INJECTION64_PATH="$TRACER" LD_LIBRARY_PATH="$P/lib/cupti:$LD_LIBRARY_PATH")
trace_summary() {  # csv marker skip label
  if [ -s "$1" ]; then
    "${SYSENV[@]}" /usr/bin/python3 "$REPO/tools/device/kernel_trace_summary.py" "$1" --marker "$2" --skip "$3" \
        --label "$4" --json "$W/trace.jsonl" 2>&1 | tee -a "$SUMMARY"
  else
    note "        trace $4: no trace written (see trace.log)"
  fi
}
trace_loom() {  # preset batch precision
  local name="$1_$3"
  bench_toml "$B/trace_$name.toml" "$1" "$2" "$3" 10 "$B/trace_run_$name"
  check "trace_loom_$name" 60 "$W/trace.log" "${TRACE_ENV[@]}" LOOM_KERNEL_TRACE_OUT="$W/trace_loom_$name.csv" \
      "$P/build/loom" train "$B/trace_$name.toml"
  trace_summary "$W/trace_loom_$name.csv" adamw 3 "loom $1 $3 $2 x 1024"
}
trace_phase() {
  [ -f "$TRACER" ] || { note "SKIP    trace (no libloom_kernel_trace.so in the pack: built without CUPTI)"; return 0; }
  # The tracer has not run on a GPU before: first 3 steps of the tiny-step GPT-2 (a few seconds
  # untraced) under a 45 s limit; if that fails or leaves no trace, the other traced runs are
  # skipped rather than each spending its timeout.
  bench_toml "$B/trace_probe.toml" gpt2-124m 16 bf16 3 "$B/trace_run_probe"
  check trace_probe 45 "$W/trace.log" "${TRACE_ENV[@]}" LOOM_KERNEL_TRACE_OUT="$W/trace_probe.csv" \
      "$P/build/loom" train "$B/trace_probe.toml"
  if ! grep -q '^kernel,' "$W/trace_probe.csv" 2>/dev/null; then
    note "SKIP    trace (the probe run left no kernel records: see trace.log)"
    return 0
  fi
  note "        trace probe: $(grep -c '^kernel,' "$W/trace_probe.csv") kernels, $(grep -c '^api,' "$W/trace_probe.csv") launch/wait calls recorded"
  trace_loom gpt2-124m 16 bf16
  if [ -x "$REPO/.device/llmc/train_gpt2cu" ]; then
    check trace_llmc 60 "$W/trace.log" "${TRACE_ENV[@]}" LOOM_KERNEL_TRACE_OUT="$W/trace_llmc.csv" \
        bash "$REPO/bench/llmc_gpu.sh" "$REPO/.device/llmc/train_gpt2cu" "$W/llmc_trace" 10 16
    # llm.c updates each parameter tensor with its own AdamW launch (and, the first time, a
    # master-weight copy between them): the marker takes both, so an update is one run.
    trace_summary "$W/trace_llmc.csv" 'adamw|copy_and_cast' 3 "llm.c gpt2-124m bf16 16 x 1024"
  fi
  if [ "${LOOM_BENCH_TORCH:-1}" != 0 ]; then
    mkdir -p "$W/big"   # torch.compile's trace holds the compilation: left out of details.tar.xz
    # PyTorch keeps its own libraries (and its own CUPTI, if it loads one; the tracer's RUNPATH
    # finds the packed one otherwise).
    check trace_torch_compile 120 "$W/trace.log" "${SYSENV[@]}" CUDA_INJECTION64_PATH="$TRACER" \
        LOOM_KERNEL_TRACE_OUT="$W/big/trace_torch_compile.csv" "$PY" bench/torch_gpu_train_step.py \
        --preset gpt2-124m --batch 16 --seq 1024 --steps 10 --compile
    trace_summary "$W/big/trace_torch_compile.csv" '(?i)adam' 8 "torch.compile gpt2-124m bf16 16 x 1024"
  fi
  # GPT-2 side by side: loom, llm.c, torch.compile (those that ran), ms a step per family.
  [ -s "$W/trace.jsonl" ] && "${SYSENV[@]}" /usr/bin/python3 "$REPO/tools/device/kernel_trace_summary.py" "$W/trace.jsonl" \
      --compare "loom gpt2-124m bf16 16 x 1024" "llm.c gpt2-124m bf16 16 x 1024" "torch.compile gpt2-124m bf16 16 x 1024" \
      2>&1 | tee -a "$SUMMARY"
  trace_loom llama-1b 4 bf16
  trace_loom llama-1b 4 fp8
  [ -s "$W/trace.jsonl" ] && "${SYSENV[@]}" /usr/bin/python3 "$REPO/tools/device/kernel_trace_summary.py" "$W/trace.jsonl" \
      --compare "loom llama-1b bf16 4 x 1024" "loom llama-1b fp8 4 x 1024" 2>&1 | tee -a "$SUMMARY"
  return 0
}
if want profile && command -v ncu >/dev/null && [ -s "$B/bench_train_000000.bin" ]; then
  # LOOM_PROFILE_CASE="preset:batch:precision ..." profiles other cases.
  for prof_case in ${LOOM_PROFILE_CASE:-gpt2-124m:16:bf16 llama-1b:4:fp8}; do
    IFS=: read -r prof_preset prof_batch prof_precision <<<"$prof_case"
    profile_case "$prof_preset" "$prof_batch" "$prof_precision" "${prof_preset}_$prof_precision"
  done
fi

# LOOM_BENCH_LOOM="preset:batch:precision:attention[:variant] ..." replaces the default runs
# (loom only).
if want bench && [ -n "${LOOM_BENCH_LOOM:-}" ]; then
  for case in $LOOM_BENCH_LOOM; do IFS=: read -r pr ba pc at va <<<"$case"; bench_loom "$pr" "$ba" "$pc" "$at" "$va"; done
elif want bench; then
  for case in "gpt2-124m 16" "llama-1b 4"; do
    set -- $case
    bench_loom "$1" "$2"
    # LOOM_BENCH_EAGER=0 leaves out PyTorch eager (always slower than torch.compile here).
    [ "${LOOM_BENCH_EAGER:-1}" = 0 ] || bench_torch "$1" "$2"
    bench_torch "$1" "$2" --compile
  done
  # llm.c's trainer (a third baseline: tools/device/build_llmc.sh built it here, into .device/llmc/)
  # on the same GPT-2 124M case, with its best settings (bench/llmc_gpu.sh).
  if [ -x "$REPO/.device/llmc/train_gpt2cu" ]; then
    check bench_llmc 150 "$W/llmc.out" bash "$REPO/bench/llmc_gpu.sh" "$REPO/.device/llmc/train_gpt2cu" "$W/llmc" "$STEPS" 16
    grep '^{' "$W/llmc.out" >> "$OUT/bench.jsonl"
  fi
  if want trace; then trace_phase; TRACED=1; fi
  # What FP8, the GELU epilogues and the pipelined attention (auto) each buy, on the same machine
  # in the same run (the scalar kernels' 227 ms for GPT-2 was measured on 2026-11-26; the first
  # tensor-core kernels' 46.1 / 87.0 ms on 2026-11-27).
  bench_loom llama-1b 4 fp8
  # FP8's delayed scales uploaded per quantisation (before session 27) against once a step.
  bench_loom llama-1b 4 fp8 auto scale_per_call
  # Blockwise scaling (1 x 128 / 128 x 128 tiles, cuBLASLt's block-scaled kernels; Hopper only).
  bench_loom llama-1b 4 fp8 auto blockwise
  bench_loom gpt2-124m 16 fp8
  # The ~1B model at sequence 4096 (issue 14): one sequence, the same 4096 tokens a step as 4 x
  # 1024, against torch.compile (the faster PyTorch at 1024) and in FP8.
  bench_loom llama-1b 1 bf16 auto "" 4096
  bench_torch llama-1b 1 --compile 4096
  bench_loom llama-1b 1 fp8 auto "" 4096
  # auto takes cuDNN's fused flash attention where the pack was built with the cudnn-frontend
  # headers (tools/device/README.md); loom's own pipelined tensor-core kernels in its place:
  bench_loom gpt2-124m 16 bf16 pipelined
  # The head's logits in f32 with a separate bf16 gradient (before session 26) against bf16 ones.
  bench_loom gpt2-124m 16 bf16 auto f32_logits
  bench_loom llama-1b 4 bf16 auto f32_logits
  bench_loom gpt2-124m 16 bf16 cudnn nondeterministic
  bench_loom llama-1b 4 bf16 pipelined
  bench_loom gpt2-124m 16 bf16 auto no_gelu_epilogue
  bench_loom gpt2-124m 16 bf16 tensor_cores
  bench_loom llama-1b 4 bf16 tensor_cores
fi
# The trace without the default bench (LOOM_CHECKS without bench, or LOOM_BENCH_LOOM's runs).
if want trace && [ "${TRACED:-0}" = 0 ] && [ -s "$B/bench_train_000000.bin" ]; then trace_phase; fi
[ -s "$OUT/bench.jsonl" ] && sed 's/^/        /' "$OUT/bench.jsonl" | tee -a "$SUMMARY"
# The calibration's predictions (3b.) against the bench's measured steps and peak memory (5.).
for plan in $PLANS; do
  IFS=: read -r plan_preset plan_batch plan_precision plan_seq <<<"$plan"
  plan_file="$W/plan_${plan_preset}_${plan_batch}_${plan_precision}_$plan_seq.json"
  [ -s "$plan_file" ] && [ -s "$OUT/bench.jsonl" ] || continue
  "${SYSENV[@]}" /usr/bin/python3 - "$plan_file" "$OUT/bench.jsonl" "$plan_preset" "$plan_batch" "$plan_precision" "$plan_seq" <<'PY' | tee -a "$SUMMARY"
import json, sys
try:
    plan = json.load(open(sys.argv[1]))
    predicted, memory = 1e3 * plan["time"]["step_s"], plan["memory_bytes"]["total"] / 2**30
except (OSError, ValueError, KeyError):
    sys.exit()
preset, batch, precision, seq = sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
for line in open(sys.argv[2]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if (r.get("engine"), r.get("preset"), r.get("batch"), r.get("precision"), r.get("attention"), r.get("seq", 1024)) == \
            ("loom", preset, batch, precision, "auto", seq):
        measured = r["ms_per_step"]
        print(f"        calibrate vs bench: {preset} {precision} {batch} x {seq}: predicted {predicted:.1f} ms/step, "
              f"measured {measured:.1f} ms/step ({100 * (predicted / measured - 1):+.1f}%); memory predicted "
              f"{memory:.2f} GiB, peak {r['peak_memory_gib']:.2f} GiB ({100 * (memory / r['peak_memory_gib'] - 1):+.1f}%)")
        break
PY
done
cp "$SUMMARY" "$W/"
grep -q '^FAIL\|^TIMEOUT' "$SUMMARY" && finish 1
finish 0
