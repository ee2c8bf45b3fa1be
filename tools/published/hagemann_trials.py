#!/usr/bin/env python3
"""150 trials of Hagemann et al.'s sweeps as published-run records: 71 measured, 79 out of memory.

Usage: hagemann_trials.py GIT_DIR public_runs.json OUT.json

GIT_DIR: a clone (or bare mirror) of JohannesHa/COLM-submission-efficient-parallelization-layouts
holding commit 641316d. The xlsx sheets are read as the zip of XML they are (no spreadsheet
library). From each of the five *_all_runs sheets 20 trials, from each of the five seqpara
sheets 10, picked with a fixed seed round-robin over (checkpointing, kernel, sequence
parallelism, out of memory) so every combination appears, preferring layouts not yet picked;
the shared file's four trials are left out. Each record copies the shared file's Hagemann
record of its kind (throughput or memory_feasibility) and its conventions; the notes name the
trial's attention kernel. Rows reading "Other Error" or "Kernel not available" are skipped.
"""
import zipfile, xml.etree.ElementTree as ET, re, sys, json
if len(sys.argv) != 4:
    sys.exit(__doc__)
NS={'m':'http://schemas.openxmlformats.org/spreadsheetml/2006/main'}
RNS='{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id'
def col2i(c):
    n=0
    for ch in c: n=n*26+ord(ch)-64
    return n-1
def read(path):
    z=zipfile.ZipFile(path)
    ss=[]
    if 'xl/sharedStrings.xml' in z.namelist():
        r=ET.fromstring(z.read('xl/sharedStrings.xml'))
        for si in r.findall('m:si',NS):
            ss.append(''.join(t.text or '' for t in si.iter('{%s}t'%NS['m'])))
    wb=ET.fromstring(z.read('xl/workbook.xml'))
    rels=ET.fromstring(z.read('xl/_rels/workbook.xml.rels'))
    relmap={r.get('Id'):r.get('Target') for r in rels}
    sheets={}
    for s in wb.find('m:sheets',NS):
        tgt=relmap[s.get(RNS)]
        tgt=tgt.lstrip('/')
        if not tgt.startswith('xl/'): tgt='xl/'+tgt
        x=ET.fromstring(z.read(tgt))
        rows=[]
        for row in x.iter('{%s}row'%NS['m']):
            cells={}
            for c in row.findall('m:c',NS):
                ref=c.get('r'); ci=col2i(re.match(r'[A-Z]+',ref).group())
                t=c.get('t'); v=c.find('m:v',NS)
                if t=='s': val=ss[int(v.text)] if v is not None else None
                elif t=='inlineStr': val=''.join(tt.text or '' for tt in c.iter('{%s}t'%NS['m']))
                elif t=='b': val=bool(int(v.text)) if v is not None else None
                elif t=='str': val=v.text if v is not None else None
                else:
                    if v is None: val=None
                    else:
                        try: f=float(v.text); val=int(f) if f.is_integer() else f
                        except: val=v.text
                cells[ci]=val
            if cells:
                mx=max(cells); rows.append((int(row.get('r')),[cells.get(i) for i in range(mx+1)]))
        sheets[s.get('name')]=rows
    return sheets
import subprocess, io
GIT=sys.argv[1]
def read_repo(path): return read(io.BytesIO(subprocess.run(['git','--git-dir='+GIT,'show','641316d:'+path],check=True,capture_output=True).stdout))
import json, copy, random, collections, sys, re
pub=json.load(open(sys.argv[2]))
H=[r for r in pub if r['id'].startswith('hagemann_')]
tmpl_ok=[r for r in H if r['kind']=='throughput'][0]
tmpl_oom=[r for r in H if r['kind']=='memory_feasibility'][0]
public_trials={int(r['id'].rsplit('_',1)[1]) for r in H}
FILES=[('data/llama_13B_bfloat16_64_GPUs_all_runs.xlsx',20),
 ('data/llama_13B_bfloat16_8k_seq_length_128_GPUs_all_runs.xlsx',20),
 ('data/llama_30B_8k_seq_length_bfloat16_128_GPUs_all_runs.xlsx',20),
 ('data/llama_30B_bfloat16_256_GPUs_all_runs.xlsx',20),
 ('data/llama_65B_bfloat16_128_GPUs_all_runs.xlsx',20),
 ('data/seqpara/llama_13B_bfloat16_32_GPUs_sequence_parallelism.xlsx',10),
 ('data/seqpara/llama_13B_bfloat16_8k_seq_length_64_GPUs_sequence_parallelism.xlsx',10),
 ('data/seqpara/llama_30B_8k_seq_length_bfloat16_64_GPUs_sequence_parallelism.xlsx',10),
 ('data/seqpara/llama_30B_bfloat16_64_GPUs_sequence_parallelism.xlsx',10),
 ('data/seqpara/llama_65B_bfloat16_64_GPUs_sequence_parallelism.xlsx',10)]
KERNEL_GUESS={
 'fused':"kernel label 'fused' is not defined in the repo beyond the plot legend 'CUDA Kernel' (reproduce_figure_kernels.py); presumably Megatron-style fused softmax attention without FlashAttention",
 'torch':"kernel label 'torch' = plain PyTorch attention ('PyTorch' in reproduce_figure_kernels.py legend), i.e. no fused/flash attention",
 'flash_attention':"kernel label 'flash_attention' (3 rows only, 30B/256-GPU sheet) is not in the repo's plot mapping; presumably FlashAttention v1 of unstated version",
}
RECOMPUTE={'disabled':'none','every_layer':'full activation checkpointing'}
rng=random.Random(641316)
out=[]; stats=collections.Counter(); skipped=[]
for path,quota in FILES:
    sheet=list(read_repo(path).values())[0]
    hdr=sheet[1][1]; rows=[dict(zip(hdr,r)) for _,r in sheet[2:]]
    fname=path.split('/')[-1]
    m=re.match(r'llama_(\d+)B_.*?(\d+)_GPUs',fname); size=int(m.group(1))
    seq=8192 if '8k_seq_length' in fname else 2048
    groups=collections.defaultdict(list)
    for r in rows:
        if r['Trial ID'] in public_trials: stats['excluded_public']+=1; continue
        st=r['Average MFU']
        if st in ('Other Error','Kernel not available'): skipped.append((path,r['Trial ID'],st)); continue
        oom = st=='OOM Error'
        groups[(r['activation_checkpointing_type'],r['kernel'],r.get('sequence_parallel'),oom)].append(r)
    keys=sorted(groups,key=str)
    for k in keys: rng.shuffle(groups[k])
    # round-robin over groups; inside a group prefer layouts (tp,pp,mbs) not yet used in this file
    picked=[]; used=collections.Counter()
    while len(picked)<quota and any(groups.values()):
        for k in keys:
            if len(picked)>=quota: break
            g=groups[k]
            if not g: continue
            g.sort(key=lambda r:used[(r['model_parallel_size'],r['pipe_parallel_size'],r['micro_batch_size'])])
            r=g.pop(0); picked.append(r)
            used[(r['model_parallel_size'],r['pipe_parallel_size'],r['micro_batch_size'])]+=1
    for r in sorted(picked,key=lambda r:r['Trial ID']):
        oom = r['Average MFU']=='OOM Error'
        rec=copy.deepcopy(tmpl_oom if oom else tmpl_ok)
        tp,pp,mbs=r['model_parallel_size'],r['pipe_parallel_size'],r['micro_batch_size']
        ws=r['World Size']; ck=r['activation_checkpointing_type']; sp=r.get('sequence_parallel')
        assert ws%(tp*pp)==0
        spsfx={True:'_sp1',False:'_sp0',None:''}[sp]
        rec['id']=f"hagemann_{size}B_seq{seq}_{ws}gpu_tp{tp}_pp{pp}_mbs{mbs}_{ck}{spsfx}_{r['Trial ID']}"
        rec['source']=re.sub(r'file \S+ \(commit', f'file {path} (commit', rec['source'])
        rec['source']=re.sub(r'Trial ID \d+$', f"Trial ID {r['Trial ID']}", rec['source'])
        rec['model']['name']=f'LLaMA {size}B'; rec['model']['seq_len']=seq; rec['model']['params_b']=float(size)
        P=rec['parallelism']; P['total_gpus']=ws; P['tp']=tp; P['pp']=pp; P['dp']=ws//(tp*pp)
        P['sequence_parallel']=sp
        rec['micro_batch']=mbs; rec['recompute']=RECOMPUTE[ck]
        M=rec['measured']
        if oom:
            M['notes']=f"run ended with OOM Error; kernel: {r['kernel']}"
        else:
            f=lambda c: float(r[c])
            M['mfu']=round(f('Average MFU'),3); M['step_time_s']=round(f('Average Step Time'),2)
            M['oom']=False
            M['other']={'tflops_megatron_formula':round(f('Average TFlops Megatron'),3),
                        'tflops_aleph_alpha_formula':round(f('Average TFlops Aleph Alpha'),3)}
            M['notes']=f"Average step time and MFU as in the xlsx; kernel: {r['kernel']}"
        if r['kernel'] in KERNEL_GUESS:
            rec['uncertain_reason']=tmpl_ok['uncertain_reason']+'; '+KERNEL_GUESS[r['kernel']]
        out.append(rec)
        stats['oom' if oom else 'ok']+=1; stats[('file',fname)]+=1
ids=[r['id'] for r in out]; assert len(set(ids))==len(ids)
assert not any(int(i.rsplit('_',1)[1]) in public_trials for i in ids)
from records import write_runs
write_runs(sys.argv[3], out)
print(len(out),dict(stats)); print('skipped',skipped)
