"""PyTorch baseline for bench_train_step: the same GPT-2 training step (forward, backward,
clip, AdamW) written the way PyTorch runs it fastest on a CPU: nn.Linear, F.layer_norm,
F.gelu(approximate="tanh"), fused QKV, one masked softmax, foreach AdamW, no autocast.
Prints one JSON object. Run with /usr/bin/python3 (Debian's python3-torch) and
OMP_WAIT_POLICY=PASSIVE."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"gpt2-124m": (12, 768, 12), "gpt2-350m": (24, 1024, 16)}


class Block(nn.Module):
    def __init__(self, c: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers: int, c: int, heads: int, vocab: int = 50257, positions: int = 1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(positions, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.register_buffer("mask", torch.ones(positions, positions, dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT2(*PRESETS[a.preset])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
    tokens = torch.randint(0, 50257, (a.batch * a.seq + 1,))
    idx, targets = tokens[:-1].view(a.batch, a.seq), tokens[1:].view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"engine": "pytorch-" + torch.__version__, "preset": a.preset, "batch": a.batch,
                      "seq": a.seq, "threads": a.threads, "steps": a.steps,
                      "ms_per_step": median * 1e3, "ms_per_step_min": times[0] * 1e3,
                      "tokens_per_s": a.batch * a.seq / median}))


if __name__ == "__main__":
    main()
