#!/usr/bin/env python3
"""Every row of llm-foundry's MPT benchmark tables as a published-run record.

Usage: mosaicml_tables.py README.md public_runs.json OUT.json

README.md is mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 061f2c7c (the
commit the shared file's MosaicML runs cite); public_runs.json is the shared file, whose first
MosaicML run lends its source text and field layout. The architecture of each size is the
scripts/train/yamls/pretrain/mpt-*.yaml of that commit (d_model, n_heads, n_layers; expansion
ratio 4, vocabulary 50,368, learned positions). A row's recomputation is its "Activation
Checkpointing" column, its precision the "Precision" column; MFU and HFU are the table's
percentages over 100.
"""
import json
import re
import sys

from records import write_runs

# size: (d_model, n_heads, n_layers) from mpt-<size>.yaml at 061f2c7c
DIMS = {'125m': (768, 12, 12), '350m': (1024, 16, 24), '760m': (1536, 12, 24), '1b': (2048, 16, 24),
        '3b': (2560, 20, 32), '7b': (4096, 32, 32), '13b': (5120, 40, 40), '30b': (7168, 56, 48),
        '70b': (8192, 64, 80)}
# section title -> (hardware.gpu, HBM GB, dense BF16 peak TFLOP/s)
SECTIONS = [('H100 80GB BF16', ('H100 80GB', 80, 989)), ('H100 80GB FP8', ('H100 80GB', 80, 989)),
            ('A100 80GB', ('A100 80GB', 80, 312)), ('A100 40GB', ('A100 40GB', 40, 312))]


def main(readme_path, shared_path, out_path):
    shared = json.load(open(shared_path))
    template = next(r for r in shared if r['id'].startswith('mpt_'))
    runs = []
    for section in re.split(r'\n## ', open(readme_path).read()):
        title = section.split('\n')[0]
        hardware = next((h for name, h in SECTIONS if name in title), None)
        if hardware is None:
            continue
        gpu, mem, peak = hardware
        lines = [l for l in section.split('\n') if l.startswith('|')]
        header = [h.strip() for h in lines[0].strip('|').split('|')]
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip('|').split('|')]
            # The A100 40GB table's header leaves out the "Model TFLOP" column its rows carry.
            names = header if len(cells) == len(header) else header[:6] + ['Model TFLOP'] + header[6:]
            row = dict(zip(names, cells))
            size, seq, gpus = row['Model'], int(row['SeqLen (T)']), int(row['# GPUs'])
            hidden, heads, layers = DIMS[size]
            run = json.loads(json.dumps(template))
            run['id'] = f"mpt_{row['GPU']}_{size}_seq{seq}_{gpus}gpu_mb{row['MicroBatchSize']}_{row['Precision']}"
            run['model'].update(name='MPT-' + size.upper(), layers=layers, hidden=hidden, heads=heads,
                                kv_heads=heads, ffn=4 * hidden, vocab=50368, seq_len=seq,
                                params_b=int(row['NumParams']) / 1e9)
            run['hardware'].update(gpu=gpu, gpu_mem_gb=mem, peak_dense_tflops_assumed=peak)
            run['parallelism'].update(total_gpus=gpus, dp=gpus, tp=1, pp=1, cp=1, ep=1, zero_stage=3)
            run['micro_batch'] = int(row['MicroBatchSize'])
            run['global_batch'] = int(row['GlobalBatchSize'])
            run['recompute'] = 'full activation checkpointing' if row['Activation Checkpointing'] == 'True' else 'none'
            run['precision'] = row['Precision']
            run['measured'] = {k: None for k in template['measured']}
            run['measured'].update(mfu=float(row['MFU']) / 100, hfu=float(row['HFU']) / 100,
                                   tokens_per_s_per_gpu=float(row['Throughput (T/s/GPU)']),
                                   notes=template['measured']['notes'])
            run['notes'] = 'grad accumulation ' + row['GradAccum']
            runs.append(run)
    write_runs(out_path, runs)


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
