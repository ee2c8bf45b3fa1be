#!/usr/bin/python3
"""Self-test of the PyTorch reference and of check_parity.py, needing no C++.

  /usr/bin/python3 tests/torch_ref/selftest.py [--keep DIR]

1. safetensors_io: round trip of every dtype the contract uses, a byte-level hand-built file,
   and rejection of malformed files.
2. models.py cross-checks against independent formulations:
   - parameter names/shapes vs the HF list, and GPT-2's closed-form parameter count;
   - GPT-2 attention block vs a naive explicit-loop (scalar Python) implementation;
   - RoPE vs the complex-number formulation (Su et al. / Meta's interleaved pairs), mapped to
     HF's rotate_half layout by the de-interleave permutation; plus its relative-position property;
   - Llama GQA attention block vs explicit loops (KV head = q head // (H/KV), complex RoPE);
   - gelu_new vs torch's tanh GELU; RMSNorm vs a scalar formula.
3. Dumps for tiny GPT-2 / Llama / tied Llama written by a second path (float64 models, hand-written
   clipping + AdamW, cast to F32) must PASS check_parity (exit 0), as must dumps from a float32
   path with per-sequence gradient accumulation; one gradient element or one trained weight
   element +1%, or the loss * (1 + 1e-4), or a NaN must FAIL (exit 1); a missing tensor/file,
   a transposed (nn.Linear-layout) Conv1D gradient, out-of-vocab targets or an unknown
   model_type must be MALFORMED (exit 2); dumps made with plausible bugs (GQA head mapping,
   interleaved RoPE, weight decay on every tensor, no bias correction, eps inside the sqrt,
   clipping ignored) must FAIL; and the exact answer must fail --strict-weights (why the
   checker exempts ill-conditioned weight elements, see check_parity.py).
"""
from __future__ import annotations

import argparse
import cmath
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_parity  # noqa: E402
import models  # noqa: E402
import safetensors_io as st  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

GPT2_CFG = {"model_type": "gpt2", "vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2,
            "n_head": 4, "n_inner": None, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
LLAMA_CFG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "tie_word_embeddings": False, "hidden_act": "silu"}

_results = []


def check(name: str, ok: bool, detail: str = "") -> bool:
    _results.append((name, bool(ok)))
    print(f"[{'ok' if ok else 'FAIL'}] {name}{'  (' + detail + ')' if detail else ''}")
    return ok


def maxdiff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


# ----------------------------------------------------------------------------------------------
# 1. safetensors_io
# ----------------------------------------------------------------------------------------------
def test_safetensors(tmp: str) -> None:
    g = torch.Generator().manual_seed(1)
    ts = {"f32": torch.randn(3, 5, generator=g), "f64": torch.randn(4, generator=g, dtype=torch.float64),
          "bf16": torch.randn(2, 3, generator=g).to(torch.bfloat16),
          "i32": torch.randint(-100, 100, (2, 7), generator=g, dtype=torch.int32),
          "i64": torch.tensor([1 << 40, -3]), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}
    p = os.path.join(tmp, "rt.safetensors")
    st.write(p, ts, {"format": "pt"})
    back, meta = st.read(p)
    same = all(back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)
               for k, v in ts.items()) and set(back) == set(ts)
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    check("safetensors round trip (F32 F64 BF16 I32 I64 scalar empty) + metadata",
          same and meta == {"format": "pt"} and n % 8 == 0)

    # Hand-built file, independent of the writer: BF16 1.0, -2.0 = 0x3F80, 0xC000; F32 [0.5]; I32 [7].
    hdr = json.dumps({"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                      "f": {"dtype": "F32", "shape": [1, 1], "data_offsets": [4, 8]},
                      "i": {"dtype": "I32", "shape": [1], "data_offsets": [8, 12]}}).encode()
    data = struct.pack("<HH", 0x3F80, 0xC000) + struct.pack("<f", 0.5) + struct.pack("<i", 7)
    p2 = os.path.join(tmp, "hand.safetensors")
    with open(p2, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)
    b, _ = st.read(p2)
    check("safetensors reads a hand-built file (BF16 via int16 view)",
          b["b"].dtype == torch.bfloat16 and b["b"].float().tolist() == [1.0, -2.0]
          and b["f"].tolist() == [[0.5]] and b["i"].tolist() == [7])

    bad = 0
    for blob in (data[:3], struct.pack("<Q", 10 ** 6) + hdr,  # too short / header past EOF
                 struct.pack("<Q", len(hdr)) + hdr + data[:-1],  # truncated data
                 struct.pack("<Q", len(hdr)) + hdr + data + b"xx",  # trailing bytes
                 struct.pack("<Q", 4) + b"nope"):  # not JSON
        with open(p2, "wb") as f:
            f.write(blob)
        try:
            st.read(p2)
        except st.SafetensorsError:
            bad += 1
    check("safetensors rejects 5 kinds of malformed files", bad == 5, f"{bad}/5 rejected")


# ----------------------------------------------------------------------------------------------
# 2. models.py cross-checks
# ----------------------------------------------------------------------------------------------
def test_param_names() -> None:
    for d in (GPT2_CFG, dict(GPT2_CFG, tie_word_embeddings=False), LLAMA_CFG,
              dict(LLAMA_CFG, tie_word_embeddings=True)):
        cfg = models.config_from_dict(d)
        m = models.build_model(cfg)
        got = {n: tuple(p.shape) for n, p in m.named_parameters()}
        want = models.expected_parameter_shapes(cfg)
        check(f"{d['model_type']} tie_word_embeddings={models.config_from_dict(d).tie_word_embeddings}: module parameter "
              f"names/shapes == HF list ({len(want)} tensors)", got == want and list(got) == list(want))
    # GPT-2 closed form: V*C + P*C + L*(12 C^2 + 13 C) + 2C (tied head, n_inner = 4C).
    c = models.config_from_dict(GPT2_CFG)
    V, P, C, L = c.vocab_size, c.n_positions, c.n_embd, c.n_layer
    n = sum(p.numel() for p in models.build_model(c).parameters())
    check("gpt2 parameter count == V*C + P*C + L*(12C^2+13C) + 2C", n == V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C,
          f"{n}")
    # gpt2-124m sanity: 124,439,808 parameters.
    big = models.expected_parameter_shapes(models.config_from_dict(dict(
        GPT2_CFG, vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)))
    check("gpt2-124m shapes give 124,439,808 parameters", sum(math.prod(s) for s in big.values()) == 124439808)


def _softmax_row(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [x / s for x in e]


def naive_causal_attention(q, k, v, kv_head_of):
    """Scalar-loop attention. q [B][H][T][d] python lists; k, v [B][KV][T][d]."""
    B, H, T, d = len(q), len(q[0]), len(q[0][0]), len(q[0][0][0])
    out = [[[[0.0] * d for _ in range(T)] for _ in range(H)] for _ in range(B)]
    for b in range(B):
        for h in range(H):
            g = kv_head_of(h)
            for t in range(T):
                scores = [sum(q[b][h][t][i] * k[b][g][s][i] for i in range(d)) / math.sqrt(d)
                          for s in range(t + 1)]  # only s <= t: causal
                p = _softmax_row(scores)
                for i in range(d):
                    out[b][h][t][i] = sum(p[s] * v[b][g][s][i] for s in range(t + 1))
    return out


def test_gpt2_attention() -> None:
    cfg = models.config_from_dict(GPT2_CFG)
    m = models.build_model(cfg, torch.float64)
    models.random_init(m, seed=11, std=0.3)  # large weights -> peaked, non-uniform softmax
    attn = m.transformer.h[0].attn
    B, T, C, H = 2, 5, cfg.n_embd, cfg.n_head
    d = C // H
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = attn(x)
    # Independent path: c_attn by explicit Conv1D arithmetic, split q|k|v, heads as column blocks.
    W, bias = attn.c_attn.weight.tolist(), attn.c_attn.bias.tolist()
    xl = x.tolist()
    qkv = [[[sum(xl[b][t][i] * W[i][j] for i in range(C)) + bias[j] for j in range(3 * C)]
            for t in range(T)] for b in range(B)]
    head = lambda off: [[[qkv[b][t][off + h * d: off + (h + 1) * d] for t in range(T)] for h in range(H)]
                        for b in range(B)]
    y = naive_causal_attention(head(0), head(C), head(2 * C), lambda h: h)
    merged = torch.tensor([[sum((y[b][h][t] for h in range(H)), []) for t in range(T)] for b in range(B)],
                          dtype=torch.float64)
    naive = merged @ attn.c_proj.weight + attn.c_proj.bias
    err = maxdiff(ref, naive)
    check("gpt2 attention == naive scalar-loop causal attention", err < 1e-12, f"max diff {err:.1e}")


def rope_complex(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate x [T, d] (HF half layout) with the complex formulation: pair j of the original
    (interleaved) layout is the complex number x[j] + i x[j + d/2] after HF's permutation, and is
    multiplied by exp(i * t * theta^(-2j/d)). Done with Python's cmath, element by element."""
    T, d = x.shape
    xl = x.tolist()
    out = [[0.0] * d for _ in range(T)]
    for t in range(T):
        for j in range(d // 2):
            z = complex(xl[t][j], xl[t][j + d // 2]) * cmath.exp(1j * t * theta ** (-2.0 * j / d))
            out[t][j], out[t][j + d // 2] = z.real, z.imag
    return torch.tensor(out, dtype=torch.float64)


def rope_meta_interleaved(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Meta's reference: consecutive pairs (2j, 2j+1) as complex numbers (view_as_complex),
    times polar(1, t*freq_j). Input/output in HF half layout via the (de)interleave permutation."""
    T, d = x.shape
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).reshape(-1)
    xi = x[:, perm]  # half layout -> interleaved: xi[2j] = x[j], xi[2j+1] = x[j + d/2]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    cis = torch.polar(torch.ones(T, d // 2, dtype=torch.float64), torch.outer(torch.arange(T, dtype=torch.float64), freqs))
    yi = torch.view_as_real(torch.view_as_complex(xi.reshape(T, d // 2, 2)) * cis).reshape(T, d)
    y = torch.empty_like(yi)
    y[:, perm] = yi
    return y


def test_rope() -> None:
    T, d, theta = 16, 8, 10000.0
    x = torch.randn(T, d, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    cos, sin = models.rope_tables(T, d, theta, torch.float64)
    ours = models.apply_rope(x, cos, sin)
    e1, e2 = maxdiff(ours, rope_complex(x, theta)), maxdiff(ours, rope_meta_interleaved(x, theta))
    check("RoPE rotate_half == scalar complex formulation", e1 < 1e-12, f"max diff {e1:.1e}")
    check("RoPE rotate_half == Meta interleaved view_as_complex after permutation", e2 < 1e-12, f"max diff {e2:.1e}")
    # Relative position property: <R_m q, R_n k> depends only on m - n.
    q, k = x[0], x[1]
    rot = lambda v, p: models.apply_rope(v.expand(T, d), cos, sin)[p]
    dots = [torch.dot(rot(q, m + 3), rot(k, m)).item() for m in range(T - 3)]
    check("RoPE <R_m q, R_n k> depends only on m - n", max(dots) - min(dots) < 1e-12)
    # And the float32 tables are the correctly rounded float64 values.
    c32, s32 = models.rope_tables(T, d, theta, torch.float32)
    check("RoPE float32 tables == rounded float64 tables", torch.equal(c32, cos.float()) and torch.equal(s32, sin.float()))


def test_llama3_rope_scaling() -> None:
    # By hand, L = 64, low 1, high 4, factor 8: wavelengths 2 pi / f of f = 1, 0.1, 0.01, 0.001 are
    # 6.28 (< 64/4: kept), 62.83 (between: s = (64/62.8319 - 1)/3 = 0.0061972, so
    # (1 - s) 0.1/8 + s 0.1 = 0.013042256), 628 and 6283 (> 64/1: divided by 8).
    scaled = models.llama3_scaled(torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64),
                                  {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64.0})
    want = torch.tensor([1.0, 0.013042256, 0.00125, 0.000125], dtype=torch.float64)
    e = maxdiff(scaled, want)
    check("llama3 RoPE scaling keeps, blends and divides the three bands as by hand", e < 1e-9, f"max diff {e:.1e}")


def test_llama_attention() -> None:
    cfg = models.config_from_dict(LLAMA_CFG)
    m = models.build_model(cfg, torch.float64)
    models.random_init(m, seed=12, std=0.3)
    attn = m.model.layers[1].self_attn
    B, T, C = 2, 6, cfg.hidden_size
    H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    cos, sin = models.rope_tables(T, D, cfg.rope_theta, torch.float64)
    ref = attn(x, cos, sin)
    lin = lambda w: x @ w.t()  # nn.Linear: y = x W^T
    q, k, v = lin(attn.q_proj.weight), lin(attn.k_proj.weight), lin(attn.v_proj.weight)

    def heads(t, n, rope):
        return [[(rope_complex(t[b, :, h * D:(h + 1) * D], cfg.rope_theta) if rope
                  else t[b, :, h * D:(h + 1) * D]).tolist() for h in range(n)] for b in range(B)]
    rep = H // KV
    y = naive_causal_attention(heads(q, H, True), heads(k, KV, True), heads(v, KV, False), lambda h: h // rep)
    merged = torch.tensor([[sum((y[b][h][t] for h in range(H)), []) for t in range(T)] for b in range(B)],
                          dtype=torch.float64)
    err = maxdiff(ref, merged @ attn.o_proj.weight.t())
    check("llama GQA attention == naive loops (kv head = h // (H/KV), complex RoPE)", err < 1e-12,
          f"max diff {err:.1e}")


def test_elementwise() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    e = maxdiff(models.gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"))
    check("gelu_new == torch gelu(approximate='tanh')", e < 1e-14, f"max diff {e:.1e}")
    n = models.RMSNorm(4, 1e-5).double()
    with torch.no_grad():
        n.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
    v = [0.3, -1.2, 2.0, 0.1]
    r = 1.0 / math.sqrt(sum(a * a for a in v) / 4 + 1e-5)
    want = torch.tensor([v[i] * r * w for i, w in enumerate([1.0, 2.0, -1.0, 0.5])], dtype=torch.float64)
    check("RMSNorm == x / sqrt(mean(x^2) + eps) * w", maxdiff(n(torch.tensor(v, dtype=torch.float64)), want) < 1e-14)
    a, b = torch.tensor([1.0, 2.0002]), torch.tensor([1.0, 2.0])
    d, rel = check_parity.rel_err(a, b)
    check("rel_err = max|a-b| / max|b|", abs(rel - d / 2.0) < 1e-12 and abs(d - 2e-4) < 1e-7)
    check("rel_err flags NaN", check_parity.rel_err(torch.tensor([float("nan")]), torch.tensor([1.0]))[1] == math.inf)


# ----------------------------------------------------------------------------------------------
# 3. Dumps from a second path (float64 + hand-written AdamW) and the checker's exit codes
# ----------------------------------------------------------------------------------------------
def make_dump(out: str, cfg_dict: dict, seed: int, B: int, T: int, clip_frac: float,
              microbatch_f32: bool = False, variant: str = "", eps: float = 1e-8) -> None:
    """Writes a dump as the C++ side would, computed in float64 with hand-written clipping and
    AdamW. clip_frac > 0 sets grad_clip to that fraction of the initial grad norm (so clipping
    is active on every step); 0 disables clipping. microbatch_f32 instead computes everything in
    float32 with gradients accumulated one sequence at a time (a different rounding path, like
    another float32 implementation would have).
    variant injects an optimizer bug: "wd_all", "no_bias_correction", "eps_in_sqrt", "no_clip"."""
    os.makedirs(out, exist_ok=True)
    cfg = models.config_from_dict(cfg_dict)
    m32 = models.build_model(cfg, torch.float32)
    models.random_init(m32, seed)
    init = {n: p.detach().clone() for n, p in m32.named_parameters()}
    g = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g, dtype=torch.int32)

    m = models.build_model(cfg, torch.float32 if microbatch_f32 else torch.float64)
    models.load_state(m, init)
    named = list(m.named_parameters())

    def fwd_bwd():
        m.zero_grad(set_to_none=True)
        if microbatch_f32:  # sum over sequences of (per-sequence mean loss) / B
            loss = 0.0
            for b in range(B):
                lb = models.lm_loss(m(inputs[b:b + 1].long()), targets[b:b + 1].long()) / B
                lb.backward()
                loss = loss + lb.detach()
        else:
            loss = models.lm_loss(m(inputs.long()), targets.long())
            loss.backward()
        return loss.detach(), [p.grad.detach().clone() for _, p in named]

    loss, grads = fwd_bwd()
    gnorm0 = math.sqrt(sum((x * x).sum().item() for x in grads))
    decay = [n for n, p in named if p.dim() >= 2]  # matrices and embeddings
    tc = {"steps": 10, "lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": eps, "weight_decay": 0.1,
          "grad_clip": round(clip_frac * gnorm0, 6), "decay_params": decay}
    # Hand-written AdamW (float64, or float32 with microbatch_f32).
    mom = [torch.zeros_like(p) for _, p in named]
    vel = [torch.zeros_like(p) for _, p in named]
    for step in range(1, tc["steps"] + 1):
        _, gs = fwd_bwd()
        if tc["grad_clip"] > 0 and variant != "no_clip":
            total = math.sqrt(sum((x * x).sum().item() for x in gs))
            coef = tc["grad_clip"] / (total + 1e-6)
            if coef < 1.0:
                gs = [x * coef for x in gs]
        with torch.no_grad():
            for i, (n, p) in enumerate(named):
                if n in decay or variant == "wd_all":
                    p.mul_(1.0 - tc["lr"] * tc["weight_decay"])
                mom[i] = tc["beta1"] * mom[i] + (1 - tc["beta1"]) * gs[i]
                vel[i] = tc["beta2"] * vel[i] + (1 - tc["beta2"]) * gs[i] * gs[i]
                m_hat = mom[i] / (1 - tc["beta1"] ** step)
                v_hat = vel[i] / (1 - tc["beta2"] ** step)
                if variant == "no_bias_correction":
                    m_hat, v_hat = mom[i], vel[i]
                if variant == "eps_in_sqrt":
                    p.sub_(tc["lr"] * m_hat / (v_hat + tc["eps"]).sqrt())
                else:
                    p.sub_(tc["lr"] * m_hat / (v_hat.sqrt() + tc["eps"]))

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=1)
    with open(os.path.join(out, "train.json"), "w") as f:
        json.dump(tc, f, indent=1)
    st.write(os.path.join(out, "model.safetensors"), init)
    st.write(os.path.join(out, "batch.safetensors"), {"inputs": inputs, "targets": targets})
    gd = {n: x.float() for (n, _), x in zip(named, grads)}
    gd["loss"] = loss.float().reshape(1)
    st.write(os.path.join(out, "grads.safetensors"), gd)
    st.write(os.path.join(out, "trained.safetensors"), {n: p.detach().float() for n, p in named})


def run_checker(d: str, *extra: str):
    r = subprocess.run([sys.executable, os.path.join(HERE, "check_parity.py"), d, *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def expect(label: str, d: str, code: int, must_contain=(), show=False, extra=()) -> None:
    rc, out = run_checker(d, *extra)
    ok = rc == code and all(s in out for s in must_contain)
    if show or not ok:
        print("    | " + out.rstrip().replace("\n", "\n    | "))
    check(f"{label}: exit {rc} (want {code})", ok)


def edit(src: str, dst: str, file: str, fn) -> str:
    if src != dst:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
    p = os.path.join(dst, file)
    t, _ = st.read(p)
    fn(t)
    st.write(p, t)
    return dst


def bump_max(t: dict, name: str, factor: float = 1.01) -> None:
    x = t[name].clone()
    i = x.abs().argmax()
    x.view(-1)[i] *= factor
    t[name] = x


def test_checker(tmp: str) -> None:
    gpt2, llama, tied = (os.path.join(tmp, n) for n in ("gpt2", "llama", "llama_tied"))
    make_dump(gpt2, GPT2_CFG, seed=100, B=2, T=12, clip_frac=0.5)  # clipping active, wpe rows 12..15 unused
    make_dump(llama, LLAMA_CFG, seed=200, B=2, T=16, clip_frac=0.0)
    make_dump(tied, dict(LLAMA_CFG, tie_word_embeddings=True), seed=300, B=3, T=9, clip_frac=0.7)

    expect("gpt2 float64-path dump passes", gpt2, 0, ["SUMMARY: PASS"], show=True)
    expect("llama (GQA, untied) float64-path dump passes", llama, 0, ["SUMMARY: PASS"], show=True)
    expect("llama (tied) float64-path dump passes", tied, 0, ["SUMMARY: PASS"])
    untied = os.path.join(tmp, "gpt2_untied")
    make_dump(untied, dict(GPT2_CFG, tie_word_embeddings=False), seed=400, B=2, T=16, clip_frac=0.0)
    expect("gpt2 (untied lm_head) float64-path dump passes", untied, 0, ["SUMMARY: PASS"])
    expect("gpt2 dump passes with a float64 reference too", gpt2, 0, ["SUMMARY: PASS"], extra=("--dtype", "float64"))

    w = os.path.join(tmp, "work")
    g_name = "transformer.h.1.attn.c_attn.weight"
    expect("gpt2 one gradient element +1%", edit(gpt2, w, "grads.safetensors", lambda t: bump_max(t, g_name)),
           1, ["FAILURES (1)", g_name], show=True)
    expect("gpt2 one trained weight element +1%",
           edit(gpt2, w, "trained.safetensors", lambda t: bump_max(t, "transformer.h.0.mlp.c_fc.weight")),
           1, ["FAILURES (1)", "transformer.h.0.mlp.c_fc.weight"])
    expect("gpt2 gradient AND trained weight perturbed",
           edit(edit(gpt2, w, "grads.safetensors", lambda t: bump_max(t, g_name)), w,
                "trained.safetensors", lambda t: bump_max(t, "transformer.wte.weight")),
           1, ["FAILURES (2)"])
    expect("gpt2 loss * (1 + 1e-4)", edit(gpt2, w, "grads.safetensors", lambda t: bump_max(t, "loss", 1 + 1e-4)),
           1, ["FAILURES (1)", "loss"])
    expect("gpt2 NaN in one gradient",
           edit(gpt2, w, "grads.safetensors",
                lambda t: t["transformer.ln_f.bias"].view(-1).__setitem__(0, float("nan"))), 1, ["ln_f.bias"])
    expect("llama one k_proj gradient element +1%",
           edit(llama, w, "grads.safetensors", lambda t: bump_max(t, "model.layers.0.self_attn.k_proj.weight")),
           1, ["k_proj"])
    expect("llama one lm_head trained weight element +1%",
           edit(llama, w, "trained.safetensors", lambda t: bump_max(t, "lm_head.weight")), 1, ["lm_head"])

    expect("gpt2 grads.safetensors lacks a parameter",
           edit(gpt2, w, "grads.safetensors", lambda t: t.pop("transformer.h.0.ln_2.bias")), 2,
           ["MALFORMED", "transformer.h.0.ln_2.bias"], show=True)
    expect("llama grads.safetensors lacks lm_head.weight",
           edit(llama, w, "grads.safetensors", lambda t: t.pop("lm_head.weight")), 2, ["lm_head.weight"])
    expect("gpt2 trained.safetensors lacks a parameter",
           edit(gpt2, w, "trained.safetensors", lambda t: t.pop("transformer.wpe.weight")), 2, ["MALFORMED"])
    expect("gpt2 grads lacks 'loss'", edit(gpt2, w, "grads.safetensors", lambda t: t.pop("loss")), 2, ["'loss'"])
    expect("gpt2 c_attn grad in nn.Linear layout [3C, C]",
           edit(gpt2, w, "grads.safetensors", lambda t: t.__setitem__(g_name, t[g_name].t().contiguous())),
           2, ["shape"])
    expect("batch targets out of vocab",
           edit(gpt2, w, "batch.safetensors", lambda t: t["targets"].view(-1).__setitem__(0, 64)), 2, ["vocab"])
    shutil.rmtree(w)
    shutil.copytree(gpt2, w)
    os.remove(os.path.join(w, "trained.safetensors"))
    expect("missing trained.safetensors", w, 2, ["missing file trained.safetensors"])
    expect("missing trained.safetensors is fine with --grads-only", w, 0, ["SUMMARY: PASS"], extra=("--grads-only",))
    with open(os.path.join(w, "config.json"), "w") as f:
        json.dump(dict(GPT2_CFG, model_type="mamba"), f)
    expect("unknown model_type", w, 2, ["model_type"], extra=("--grads-only",))

    # The raw max metric on every trained-weight element cannot cope with Adam's amplification of
    # rounding noise, even for the exact (float64) answer: GPT-2's key bias has an exactly-zero
    # gradient, float32 gives ~1e-9 noise, and with eps=1e-12 Adam turns that into ~lr per step.
    eps_dump = os.path.join(tmp, "gpt2_eps")
    make_dump(eps_dump, GPT2_CFG, seed=100, B=2, T=12, clip_frac=0.5, eps=1e-12)
    expect("gpt2 float64-path dump, eps=1e-12, passes", eps_dump, 0, ["SUMMARY: PASS"])
    expect("same dump FAILS with --strict-weights (key-bias elements)", eps_dump, 1,
           ["SUMMARY: FAIL", "attn.c_attn.bias"], show=True, extra=("--strict-weights",))
    # Another float32 rounding path (per-sequence gradient accumulation, hand-written AdamW in
    # float32) must pass too.
    f32 = os.path.join(tmp, "f32_microbatch")
    make_dump(f32, GPT2_CFG, seed=100, B=2, T=12, clip_frac=0.5, microbatch_f32=True)
    expect("gpt2 float32 micro-batched dump passes", f32, 0, ["SUMMARY: PASS"], show=True)
    make_dump(f32, LLAMA_CFG, seed=200, B=4, T=16, clip_frac=0.3, microbatch_f32=True)
    expect("llama float32 micro-batched dump passes", f32, 0, ["SUMMARY: PASS"], show=True)

    # Optimizer bugs must be caught despite the ill-conditioning allowance.
    for variant in ("wd_all", "no_bias_correction", "eps_in_sqrt", "no_clip"):
        make_dump(w, GPT2_CFG, seed=100, B=2, T=12, clip_frac=0.5, variant=variant)
        expect(f"gpt2 dump with optimizer bug [{variant}]", w, 1, ["SUMMARY: FAIL"])

    # Plausible C++ convention bugs must be caught (dumps generated with a wrong reference).
    bugs = {
        "GQA kv head = h % KV instead of h // (H/KV)":
            ("repeat_kv", lambda x, n: x if n == 1 else x.repeat(1, n, 1, 1)),
        "RoPE on interleaved pairs instead of rotate_half":
            ("rotate_half", lambda x: torch.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)),
    }
    for label, (fn, bad) in bugs.items():
        good = getattr(models, fn)
        if fn == "rotate_half":  # rotate_half pairs with the interleaved tables
            good_tables = models.rope_tables
            models.rope_tables = lambda T, d, th, dt, dev=None, scaling=None: tuple(
                t[:, :d // 2].repeat_interleave(2, -1) for t in good_tables(T, d, th, dt, dev, scaling))
        setattr(models, fn, bad)
        try:
            make_dump(w, LLAMA_CFG, seed=200, B=2, T=16, clip_frac=0.0)
        finally:
            setattr(models, fn, good)
            if fn == "rotate_half":
                models.rope_tables = good_tables
        expect(f"llama dump with bug [{label}]", w, 1, ["SUMMARY: FAIL"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="also leave the example gpt2/llama dumps in this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom_torch_ref_") as tmp:
        test_safetensors(tmp)
        test_param_names()
        test_elementwise()
        test_gpt2_attention()
        test_rope()
        test_llama3_rope_scaling()
        test_llama_attention()
        test_checker(tmp)
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            for n in ("gpt2", "llama", "llama_tied"):
                shutil.rmtree(os.path.join(args.keep, n), ignore_errors=True)
                shutil.copytree(os.path.join(tmp, n), os.path.join(args.keep, n))
    failed = [n for n, ok in _results if not ok]
    print(f"selftest: {len(_results) - len(failed)}/{len(_results)} checks passed")
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
