#!/usr/bin/env bash
# llm.c (github.com/karpathy/llm.c) as a third GPU baseline beside PyTorch eager and
# torch.compile: its train_gpt2cu, built outside loom by tools/device/build_llmc.sh (its code is
# never copied into loom) and carried to the device machine. The case is the bench's GPT-2 124M:
# random init (-e d12), batch 16 x 1024, bf16 with f32 master weights, cuDNN flash attention,
# llm.c's GELU fusion default for sm_90, and no recomputation (-r 0): its fastest settings for a
# model that fits. Tokens are random ids in llm.c's shard format (header magic 20240520,
# version 1, count; then uint16 ids), written here: throughput does not depend on them.
#
#   bench/llmc_gpu.sh TRAIN_GPT2CU WORK_DIR [STEPS] [BATCH]
# prints llm.c's log, then one JSON line {"engine": "llm.c", ...} with the median step time of
# the steps after the first 5 (the bench's convention for loom too).
set -euo pipefail
BIN=$1 WORK=$2 STEPS=${3:-30} BATCH=${4:-16}
SEQ=1024
mkdir -p "$WORK"
python3 - "$WORK" "$STEPS" "$BATCH" "$SEQ" <<'PY'
import random, struct, sys
work, steps, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1)
for name, count in (("train.bin", batch * seq * (steps + 2) + 1), ("val.bin", batch * seq + 1)):
    header = [20240520, 1, count] + [0] * 253
    with open(f"{work}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{count}H", *(rng.randrange(50257) for _ in range(count))))
PY
cd "$WORK"
"$BIN" -i train.bin -j val.bin -e d12 -b "$BATCH" -t "$SEQ" -x "$STEPS" -v 100000 -m 1 -s 0 -r 0 \
    -l 3e-4 -c 0.1 | tee llmc.log
python3 - llmc.log "$BATCH" "$SEQ" <<'PY'
import json, re, statistics, sys
ms = [float(m.group(1)) for m in re.finditer(r"^step\s+\d+/\d+ \|.*\| ([0-9.]+) ms \|", open(sys.argv[1]).read(), re.M)]
if len(ms) <= 5:
    sys.exit(f"llm.c printed {len(ms)} steps; expected more than 5")
step = statistics.median(ms[5:])
batch, seq = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps({"engine": "llm.c", "preset": "gpt2-124m", "batch": batch, "seq": seq, "precision": "bf16",
                  "attention": "cudnn", "ms_per_step": step, "tokens_per_s": batch * seq / step * 1e3}))
PY
