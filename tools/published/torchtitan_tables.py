#!/usr/bin/env python3
"""Every row of torchtitan's December 2024 H100 benchmark as a published-run record.

Usage: torchtitan_tables.py public_runs.json OUT.json

The rows are transcribed from pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md
(torchtitan 9dec370, torch 1963fc8): Tables 1-6, 18 rows (FSDP with and without torch.compile
and Float8, context parallelism to 262,144 tokens, 2D FSDP + TP on 70B, 3D and 4D on 405B with
1F1B and interleaved 1F1B). "Local batch size" is written as micro_batch, as the shared file's
torchtitan runs write it; the global batch is the table's, or local x FSDP degree where the
table gives none. The shared file's torchtitan Table 1 run lends source text and field layout.
"""
import json
import sys

from records import write_runs

if len(sys.argv) != 3:
    sys.exit(__doc__)
pub=json.load(open(sys.argv[1]))
T=[r for r in pub if r['id']=='torchtitan_h100_202412_t1_fsdp_compile'][0]
L8=dict(name="Llama 3.1 8B",layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,params_b=8)
L70=dict(name="Llama 3.1 70B",layers=80,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=128256,params_b=70)
L405=dict(name="Llama 3.1 405B",layers=126,hidden=16384,heads=128,kv_heads=8,ffn=53248,vocab=128256,params_b=405)
rows=[]
def add(id,model,seq,gpus,tp,pp,cp,dp,mbs,gb,rec,prec,notes,tps,mem,sched=None):
    r=json.loads(json.dumps(T)); r['id']='torchtitan_h100_202412_'+id[3:]
    r['model'].update(model); r['model']['seq_len']=seq
    r['parallelism'].update(total_gpus=gpus,tp=tp,pp=pp,cp=cp,dp=dp,zero_stage=3,fsdp=f"FSDP2 degree {dp}",notes=notes,pp_schedule=sched)
    r['micro_batch']=mbs; r['global_batch']=gb; r['recompute']=rec; r['precision']=prec
    r['measured']['tokens_per_s_per_gpu']=tps; r['measured']['memory_per_gpu_gb']=mem
    rows.append(r)
sel='selective activation checkpointing'; full='full activation checkpointing'
add('tt_t1_fsdp',L8,8192,8,1,1,1,8,2,16,sel,'BF16','FSDP',5762,82.4)
add('tt_t1_compile',L8,8192,8,1,1,1,8,2,16,sel,'BF16','FSDP + torch.compile',6667,77.0)
add('tt_t1_fp8',L8,8192,8,1,1,1,8,2,16,sel,'Float8 (torchao) on nn.Linear','FSDP + torch.compile + Float8',8532,76.8)
for dp,cp,seq,tps,mem in [(8,1,32768,3890,83.9),(4,2,65536,2540,84.2),(2,4,131072,1071,84.0),(1,8,262144,548,84.5)]:
    add(f'tt_t2_cp{cp}',L8,seq,8,1,1,cp,dp,1,dp,full,'Float8 (torchao) on nn.Linear','FSDP + CP + torch.compile + Float8',tps,mem)
add('tt_t3_fsdp',L8,8192,128,1,1,1,128,2,256,sel,'BF16','FSDP',5605,67.0)
add('tt_t3_compile',L8,8192,128,1,1,1,128,2,256,sel,'BF16','FSDP + torch.compile',6514,62.0)
add('tt_t3_fp8',L8,8192,128,1,1,1,128,2,256,sel,'Float8 (torchao) on nn.Linear','FSDP + torch.compile + Float8',8380,61.8)
add('tt_t4_2d',L70,8192,256,8,1,1,32,16,512,full,'Float8 (torchao) on nn.Linear','FSDP + TP + torch.compile + Float8',829,71.9)
add('tt_t4_asynctp',L70,8192,256,8,1,1,32,16,512,full,'Float8 (torchao) on nn.Linear','FSDP + TP + AsyncTP + torch.compile + Float8',876,67.6)
add('tt_t5_1f1b',L405,8192,512,8,8,1,8,32,256,full,'Float8 (torchao) on nn.Linear','FSDP + TP + PP + AsyncTP + Float8',100,82.5,'1F1B')
add('tt_t5_inter',L405,8192,512,8,8,1,8,32,256,full,'Float8 (torchao) on nn.Linear','FSDP + TP + PP + AsyncTP + Float8',128,72.7,'Interleaved 1F1B')
for dp,cp,seq,tps,mem in [(8,1,32768,76,75.3),(4,2,65536,47,75.9),(2,4,131072,31,77.1),(1,8,262144,16,84.9)]:
    add(f'tt_t6_cp{cp}',L405,seq,512,8,8,cp,dp,8,8*dp,full,'Float8 (torchao) on nn.Linear','FSDP + TP + PP + CP + AsyncTP + Float8 + 1F1B',tps,mem,'1F1B')
write_runs(sys.argv[2], rows)
