"""PyTorch reference for loom's GPU benchmark: the same GPT-2 / Llama training step (forward,
backward, clip, AdamW) on one GPU in BF16 autocast with fp32 weights, written the way PyTorch
runs it fastest: fused QKV, F.scaled_dot_product_attention (flash), fused AdamW, and with
--compile, torch.compile of the model. Prints one JSON object: ms/step, tokens/s, MFU against
the GPU's dense BF16 peak and against the bf16 GEMM rate measured here, peak memory.
Model FLOPs per token follow loom's model/flops.hpp (6 x matmul parameters + 6 x L x T x C).
  python3 bench/torch_gpu_train_step.py --preset gpt2-124m --batch 8 --seq 1024 [--compile]"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# (arch, layers, d, heads, kv heads, ffn, vocab, tied): loom's presets (model/config.cpp).
PRESETS = {
    "gpt2-124m": ("gpt2", 12, 768, 12, 12, 3072, 50257, True),
    "gpt2-350m": ("gpt2", 24, 1024, 16, 16, 4096, 50257, True),
    "llama-1b": ("llama", 16, 2048, 32, 8, 8192, 128256, True),
    # For a smoke test of this script on a CPU (--device cpu).
    "tiny-llama": ("llama", 2, 64, 4, 2, 128, 512, False),
}
# Dense BF16 tensor-core peaks (NVIDIA datasheets, without sparsity), TFLOP/s.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "B200": 2250.0}


class Block(nn.Module):
    def __init__(self, arch, c, heads, kv_heads, ffn):
        super().__init__()
        self.arch, self.heads, self.kv_heads, self.head_dim = arch, heads, kv_heads, c // heads
        norm = (lambda: nn.LayerNorm(c)) if arch == "gpt2" else (lambda: RMSNorm(c))
        self.norm1, self.norm2 = norm(), norm()
        bias = arch == "gpt2"
        self.qkv = nn.Linear(c, (heads + 2 * kv_heads) * self.head_dim, bias=bias)
        self.out = nn.Linear(c, c, bias=bias)
        self.up = nn.Linear(c, ffn if arch == "gpt2" else 2 * ffn, bias=bias)
        self.down = nn.Linear(ffn, c, bias=bias)

    def forward(self, x, rope):
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = causal_attention(q, k, v)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        h = self.up(self.norm2(x))
        if self.arch == "gpt2":
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return x + self.down(h)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0: flash / memory-efficient kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.size(-2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return att.softmax(dim=-1) @ v


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(c)), eps

    def forward(self, x):
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def rope_table(head_dim, seq, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), inv)
    return angles.cos(), angles.sin()


def apply_rope(x, rope):
    cos, sin = rope
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Model(nn.Module):
    def __init__(self, arch, layers, c, heads, kv_heads, ffn, vocab, tied, seq, device):
        super().__init__()
        self.arch = arch
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c) if arch == "gpt2" else None
        self.blocks = nn.ModuleList(Block(arch, c, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(c) if arch == "gpt2" else RMSNorm(c)
        self.head = None if tied else nn.Linear(c, vocab, bias=False)
        self.rope = None if arch == "gpt2" else rope_table(c // heads, seq, 500000.0, device)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.rope)
        x = self.norm(x)
        logits = x @ self.wte.weight.t() if self.head is None else self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def matmul_params(model, arch, tied):
    n = sum(p.numel() for p in model.parameters())
    if arch == "gpt2":
        n -= model.wpe.weight.numel()
    if not tied:
        n -= model.wte.weight.numel()
    return n


def measured_bf16_gemm_tflops(size=8192, repeats=20):
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of this script")
    a = p.parse_args()
    if a.compile and not hasattr(torch, "compile"):
        raise SystemExit(f"--compile needs PyTorch >= 2.0; this is {torch.__version__}")
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    arch, layers, c, heads, kv_heads, ffn, vocab, tied = PRESETS[a.preset]
    model = Model(arch, layers, c, heads, kv_heads, ffn, vocab, tied, a.seq, a.device).to(a.device)
    flops_per_token = 6 * matmul_params(model, arch, tied) + 6 * layers * a.seq * c
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True) if cuda else
           torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True))
    run = torch.compile(model) if a.compile else model
    tokens = torch.randint(0, vocab, (a.batch * a.seq + 1,), device=a.device)
    idx, targets = tokens[:-1].view(a.batch, a.seq), tokens[1:].view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = run(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), float("nan"))
    gemm = measured_bf16_gemm_tflops() if cuda else float("nan")
    achieved = flops_per_token * a.batch * a.seq / median / 1e12
    print(json.dumps({"engine": "pytorch-" + torch.__version__ + ("-compile" if a.compile else "-eager"),
                      "gpu": name, "preset": a.preset, "batch": a.batch, "seq": a.seq, "steps": a.steps,
                      "ms_per_step": median * 1e3, "tokens_per_s": a.batch * a.seq / median,
                      "model_tflops": achieved, "mfu_vs_datasheet": achieved / peak,
                      "mfu_vs_measured_gemm": achieved / gemm, "measured_bf16_gemm_tflops": gemm,
                      "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else float("nan")}))


if __name__ == "__main__":
    main()
