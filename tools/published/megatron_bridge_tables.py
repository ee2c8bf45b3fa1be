#!/usr/bin/env python3
"""Megatron-Bridge's dense Llama pre-training rows as published-run records.

Usage: megatron_bridge_tables.py public_runs.json OUT.json

Rows transcribed from NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at
0a25f911 (the commit the shared file cites): the 26.02 and 25.11 containers' LLAMA3_8B,
LLAMA3_70B and LLAMA3.1_405B rows on DGX-H100, DGX-B200 and DGX-GB200 in FP8 (FP4 rows and the
GB300/B300 systems are left out: no 4-bit GEMMs in the planner; the GB300 rows name parts it
has only as B300). Sequence length 8192 throughout; dp = GPUs / (TP x PP x CP); "FSDP" is the
table's column. The shared file's Megatron-Bridge Llama 3.1 8B run lends source and layout.
"""
import json
import sys

from records import template, write_runs

MODELS = {
    '8': dict(name='Llama 3.1 8B', layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, params_b=8),
    '70': dict(name='Llama 3 70B', layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, params_b=70),
    '405': dict(name='Llama 3.1 405B', layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256,
                params_b=405),
}
# (GPU, memory GB, the dense BF16 peak the table's MFU would use): the template's 989 is the
# H100's; a Blackwell row states none (the planner's part preset holds its rate).
SYSTEMS = {'h100': ('H100-SXM 80GB (DGX-H100)', 80, 989), 'b200': ('B200 (DGX-B200)', None, None),
           'gb200': ('GB200 (DGX-GB200)', None, None)}
# release, system, model, GPUs, precision, GBS, MBS, FSDP, TP, PP, CP, VP, tokens/s/GPU, model TFLOP/s/GPU
ROWS = [
    ('26.02', 'h100', '70', 64, 'FP8', 256, 1, 0, 4, 8, 1, 5, 1621, 728),
    ('26.02', 'h100', '405', 1024, 'FP8', 1536, 1, 0, 8, 8, 2, 8, 311, 784),
    ('26.02', 'gb200', '70', 64, 'FP8', 256, 2, 64, 1, 1, 1, None, 4040, 1815),
    ('26.02', 'gb200', '405', 256, 'FP8', 1536, 1, 0, 4, 16, 1, 4, 793, 2004),
    ('25.11', 'h100', '8', 8, 'FP8-CS', 128, 1, 8, 1, 1, 1, None, 14451, 744),
    ('25.11', 'h100', '70', 64, 'FP8-CS', 128, 1, 0, 4, 8, 1, 5, 1602, 719),
    ('25.11', 'h100', '405', 1024, 'FP8-CS', 512, 1, 0, 8, 8, 2, 8, 292, 737),
    ('25.11', 'b200', '8', 8, 'FP8-CS', 128, 2, 0, 1, 1, 1, None, 30624, 1576),
    ('25.11', 'b200', '405', 128, 'FP8-CS', 64, 1, 0, 4, 8, 2, 8, 661, 1667),
    ('25.11', 'gb200', '8', 8, 'FP8-CS', 128, 2, 0, 1, 1, 1, None, 31508, 1622),
    ('25.11', 'gb200', '70', 64, 'FP8-CS', 256, 2, 64, 1, 1, 1, None, 4312, 1937),
    ('25.11', 'gb200', '405', 256, 'FP8-CS', 1536, 1, 0, 4, 16, 1, 4, 813, 2053),
]


def main(shared_path, out_path):
    first = template(shared_path, 'mbridge2511_h100_LLAMA3_8B_8gpu')
    runs = []
    for release, system, model, gpus, precision, gbs, mbs, fsdp, tp, pp, cp, vp, tokens, tflops in ROWS:
        run = json.loads(json.dumps(first))
        run['id'] = f'mbridge{release.replace(".", "")}_{system}_llama{model}b_{gpus}gpu'
        run['source'] = first['source'].replace("'25.11 NeMo Container'", f"'{release} NeMo Container'")
        run['model'].update(MODELS[model])
        run['model']['seq_len'] = 8192
        gpu, mem, peak = SYSTEMS[system]
        run['hardware'].update(gpu=gpu, gpu_mem_gb=mem, peak_dense_tflops_assumed=peak)
        run['parallelism'].update(total_gpus=gpus, tp=tp, pp=pp, cp=cp, dp=gpus // (tp * pp * cp), vp=vp,
                                  fsdp=f'Megatron FSDP (column value {fsdp})' if fsdp else 'DDP (FSDP=0)')
        run['micro_batch'] = mbs
        run['global_batch'] = gbs
        run['precision'] = precision
        run['measured'].update(tflops_per_gpu=tflops, tokens_per_s_per_gpu=tokens, notes=None)
        runs.append(run)
    write_runs(out_path, runs)


if __name__ == '__main__':
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
