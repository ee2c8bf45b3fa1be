"""Plain-PyTorch reference implementations of loom's two model families.

Written from the papers and the documented semantics of Hugging Face's GPT2LMHeadModel and
LlamaForCausalLM (not copied from either code base). Parameter names and layouts are exactly
HF's, so a state dict round-trips with HF checkpoints:

GPT-2 (lm_head tied to transformer.wte unless tie_word_embeddings is false, then lm_head.weight [V, C]):
    transformer.wte.weight [V, C]              transformer.wpe.weight [P, C]
    transformer.h.{i}.ln_1.{weight,bias} [C]
    transformer.h.{i}.attn.c_attn.weight [C, 3C]  .bias [3C]     (Conv1D: y = x @ W + b)
    transformer.h.{i}.attn.c_proj.weight [C, C]   .bias [C]
    transformer.h.{i}.ln_2.{weight,bias} [C]
    transformer.h.{i}.mlp.c_fc.weight [C, F]      .bias [F]      (F = n_inner or 4C)
    transformer.h.{i}.mlp.c_proj.weight [F, C]    .bias [C]
    transformer.ln_f.{weight,bias} [C]

Llama (nn.Linear layout [out, in], no biases; Dh = C / H):
    model.embed_tokens.weight [V, C]
    model.layers.{i}.input_layernorm.weight [C]
    model.layers.{i}.self_attn.q_proj.weight [H*Dh, C]   k_proj/v_proj [KV*Dh, C]   o_proj [C, H*Dh]
    model.layers.{i}.post_attention_layernorm.weight [C]
    model.layers.{i}.mlp.gate_proj.weight [F, C]   up_proj [F, C]   down_proj [C, F]
    model.norm.weight [C]
    lm_head.weight [V, C]        (absent when tie_word_embeddings: logits use embed_tokens)

Every model maps int token ids [B, T] to logits [B, T, V]; `lm_loss` is the mean
cross-entropy over all B*T positions. There is no dropout anywhere.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConfigError(ValueError):
    """A config.json this reference cannot (or refuses to) model."""


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------
@dataclass
class GPT2Config:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    layer_norm_epsilon: float
    tie_word_embeddings: bool = True  # HF default for GPT-2; False adds lm_head.weight [V, C]
    model_type: str = "gpt2"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    model_type: str = "llama"
    # Llama 3.1's RoPE scaling: {"factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"}, or None for plain RoPE.
    rope_scaling: Optional[dict] = None
    # Mixtral (model_type "mixtral"): every MLP is a sparse MoE block of num_local_experts
    # SwiGLU experts, num_experts_per_tok per token; 0 experts is plain Llama.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    router_aux_loss_coef: float = 0.0
    router_z_loss_coef: float = 0.0
    moe_router: str = "softmax"
    moe_capacity_factor: float = 0.0
    n_shared_experts: int = 0
    # Fine-grained experts and dense layers among the MoE ones (DeepSeek's names, loom's spacing):
    # experts moe_intermediate_size wide (0: intermediate_size); layer l is MoE when
    # l >= first_k_dense_replace and (l - first_k_dense_replace) % loom_moe_every == 0.
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    loom_moe_every: int = 1
    # HF's head_dim (Mistral NeMo, Qwen3): heads of this width, q and the attention output
    # num_attention_heads x head_dim wide; 0: hidden_size / num_attention_heads.
    explicit_head_dim: int = 0
    # Sliding-window attention (model_type "mistral"/"mixtral" sliding_window, transformers'
    # convention: query i sees keys i - W + 1 .. i) on the layers layer_types names
    # "sliding_attention", or on every layer without layer_types; 0: none.
    sliding_window: int = 0
    layer_types: Optional[list] = None

    def window_of(self, layer: int) -> int:
        if not self.sliding_window:
            return 0
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return 0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_local_experts > 0 and layer >= self.first_k_dense_replace
                and (layer - self.first_k_dense_replace) % self.loom_moe_every == 0)

    @property
    def expert_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size


Config = Union[GPT2Config, LlamaConfig]


def _int(d: dict, key: str, default=None) -> int:
    v = d.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"config key '{key}' must be a positive integer, got {v!r}")
    return v


def _float(d: dict, key: str, default=None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"config key '{key}' must be a positive number, got {v!r}")
    return float(v)


def config_from_dict(d: dict) -> Config:
    """Parses an HF-style config dict. Refuses options this reference does not implement."""
    if not isinstance(d, dict):
        raise ConfigError("config must be a JSON object")
    mt = d.get("model_type")
    if mt == "gpt2":
        act = d.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ConfigError(f"gpt2 activation_function {act!r} unsupported (want gelu_new)")
        if d.get("scale_attn_weights", True) is not True or d.get("scale_attn_by_inverse_layer_idx", False):
            raise ConfigError("gpt2: only plain 1/sqrt(head_dim) attention scaling is supported")
        c = _int(d, "n_embd")
        inner = d.get("n_inner")
        tie = d.get("tie_word_embeddings", True)
        if not isinstance(tie, bool):
            raise ConfigError(f"tie_word_embeddings must be a bool, got {tie!r}")
        cfg = GPT2Config(
            vocab_size=_int(d, "vocab_size"), n_positions=_int(d, "n_positions"), n_embd=c,
            n_layer=_int(d, "n_layer"), n_head=_int(d, "n_head"),
            n_inner=4 * c if inner is None else _int(d, "n_inner"),
            layer_norm_epsilon=_float(d, "layer_norm_epsilon", 1e-5), tie_word_embeddings=tie)
        if c % cfg.n_head:
            raise ConfigError(f"gpt2: n_embd {c} is not divisible by n_head {cfg.n_head}")
        return cfg
    if mt in ("loom_mistral", "loom_mixtral"):  # loom's names for windows among global layers
        mt = mt[len("loom_"):]
    if mt in ("llama", "mistral", "mixtral"):
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"llama hidden_act {d.get('hidden_act')!r} unsupported (want silu)")
        scaling = d.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
            if kind != "llama3":
                raise ConfigError(f"llama: rope_scaling {scaling!r} unsupported (want null or rope_type llama3)")
            scaling = {k: float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                      "original_max_position_embeddings")}
        if d.get("attention_bias", False) or d.get("mlp_bias", False):
            raise ConfigError("llama: attention_bias / mlp_bias are not supported")
        c, h = _int(d, "hidden_size"), _int(d, "num_attention_heads")
        kv = _int(d, "num_key_value_heads", h)
        tie = d.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise ConfigError(f"tie_word_embeddings must be a bool, got {tie!r}")
        cfg = LlamaConfig(
            vocab_size=_int(d, "vocab_size"), hidden_size=c,
            intermediate_size=_int(d, "intermediate_size"),
            num_hidden_layers=_int(d, "num_hidden_layers"), num_attention_heads=h,
            num_key_value_heads=kv,
            max_position_embeddings=_int(d, "max_position_embeddings", 2048),
            rms_norm_eps=_float(d, "rms_norm_eps", 1e-6), rope_theta=_float(d, "rope_theta", 10000.0),
            tie_word_embeddings=tie, model_type=mt, rope_scaling=scaling)
        if mt in ("mistral", "mixtral") and d.get("sliding_window") is not None:
            cfg.sliding_window = _int(d, "sliding_window")
            cfg.layer_types = d.get("layer_types")
            if cfg.layer_types is not None and (len(cfg.layer_types) != cfg.num_hidden_layers or any(
                    t not in ("sliding_attention", "full_attention") for t in cfg.layer_types)):
                raise ConfigError(f"layer_types {cfg.layer_types!r} is not one type per layer")
        if mt == "mixtral":
            cfg.num_local_experts = _int(d, "num_local_experts")
            cfg.num_experts_per_tok = _int(d, "num_experts_per_tok")
            if cfg.num_experts_per_tok > cfg.num_local_experts:
                raise ConfigError("mixtral: num_experts_per_tok > num_local_experts")
            # transformers adds the balancing loss only with output_router_logits.
            if d.get("output_router_logits", False):
                cfg.router_aux_loss_coef = float(d.get("router_aux_loss_coef", 0.001))
            cfg.router_z_loss_coef = float(d.get("router_z_loss_coef", 0.0))
            cfg.moe_router = d.get("loom_moe_router", "softmax")
            if cfg.moe_router not in ("softmax", "sigmoid"):
                raise ConfigError(f"mixtral: loom_moe_router {cfg.moe_router!r} (want softmax or sigmoid)")
            cfg.moe_capacity_factor = float(d.get("loom_moe_capacity_factor", 0.0))
            cfg.n_shared_experts = int(d.get("n_shared_experts", 0) or 0)
            cfg.moe_intermediate_size = int(d.get("moe_intermediate_size", 0) or 0)
            cfg.first_k_dense_replace = int(d.get("first_k_dense_replace", 0) or 0)
            cfg.loom_moe_every = int(d.get("loom_moe_every", 1) or 1)
            if float(d.get("loom_moe_bias_rate", 0.0)) != 0.0:
                raise ConfigError("mixtral: loom_moe_bias_rate (selection-bias updates) is not in this reference")
        if d.get("head_dim") is not None:
            cfg.explicit_head_dim = _int(d, "head_dim")
            if cfg.explicit_head_dim <= 0:
                raise ConfigError(f"llama: head_dim {cfg.explicit_head_dim} is not positive")
        elif c % h:
            raise ConfigError(f"llama: hidden_size {c} is not divisible by num_attention_heads {h}")
        if h % kv:
            raise ConfigError(f"llama: num_attention_heads {h} is not a multiple of num_key_value_heads {kv}")
        if cfg.head_dim % 2:
            raise ConfigError(f"llama: head_dim {cfg.head_dim} must be even for RoPE")
        return cfg
    raise ConfigError(f"unknown model_type {mt!r} (want 'gpt2', 'llama', 'mistral' or 'mixtral')")


def load_config(path: str) -> Config:
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(d)


def expected_parameter_shapes(cfg: Config) -> Dict[str, Tuple[int, ...]]:
    """HF name -> shape of every trainable parameter, written out from the spec alone (used to
    cross-check the nn.Modules below and to validate dumps)."""
    out: Dict[str, Tuple[int, ...]] = {}
    if isinstance(cfg, GPT2Config):
        C, Fi = cfg.n_embd, cfg.n_inner
        out["transformer.wte.weight"] = (cfg.vocab_size, C)
        out["transformer.wpe.weight"] = (cfg.n_positions, C)
        for i in range(cfg.n_layer):
            p = f"transformer.h.{i}."
            out[p + "ln_1.weight"] = (C,)
            out[p + "ln_1.bias"] = (C,)
            out[p + "attn.c_attn.weight"] = (C, 3 * C)
            out[p + "attn.c_attn.bias"] = (3 * C,)
            out[p + "attn.c_proj.weight"] = (C, C)
            out[p + "attn.c_proj.bias"] = (C,)
            out[p + "ln_2.weight"] = (C,)
            out[p + "ln_2.bias"] = (C,)
            out[p + "mlp.c_fc.weight"] = (C, Fi)
            out[p + "mlp.c_fc.bias"] = (Fi,)
            out[p + "mlp.c_proj.weight"] = (Fi, C)
            out[p + "mlp.c_proj.bias"] = (C,)
        out["transformer.ln_f.weight"] = (C,)
        out["transformer.ln_f.bias"] = (C,)
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (cfg.vocab_size, C)
    else:
        C, Fi, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
        out["model.embed_tokens.weight"] = (cfg.vocab_size, C)
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (C,)
            out[p + "self_attn.q_proj.weight"] = (H * D, C)
            out[p + "self_attn.k_proj.weight"] = (KV * D, C)
            out[p + "self_attn.v_proj.weight"] = (KV * D, C)
            out[p + "self_attn.o_proj.weight"] = (C, H * D)
            out[p + "post_attention_layernorm.weight"] = (C,)
            if cfg.is_moe_layer(i):
                Fe = cfg.expert_size
                out[p + "block_sparse_moe.gate.weight"] = (cfg.num_local_experts, C)
                for e in range(cfg.num_local_experts):
                    x = p + f"block_sparse_moe.experts.{e}."
                    out[x + "w1.weight"] = (Fe, C)
                    out[x + "w3.weight"] = (Fe, C)
                    out[x + "w2.weight"] = (C, Fe)
                if cfg.n_shared_experts:
                    x = p + "block_sparse_moe.shared_experts."
                    W = cfg.n_shared_experts * Fe
                    out[x + "w1.weight"] = (W, C)
                    out[x + "w3.weight"] = (W, C)
                    out[x + "w2.weight"] = (C, W)
                continue
            out[p + "mlp.gate_proj.weight"] = (Fi, C)
            out[p + "mlp.up_proj.weight"] = (Fi, C)
            out[p + "mlp.down_proj.weight"] = (C, Fi)
        out["model.norm.weight"] = (C,)
        if not cfg.tie_word_embeddings:
            out["lm_head.weight"] = (cfg.vocab_size, C)
    return out


# ----------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (HF "gelu_new", Hendrycks & Gimpel 2016)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, all [B, H, T, d] -> [B, H, T, d]. window > 0
    also masks the keys more than window - 1 before the query."""
    T, d = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    if window > 0:
        future |= torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-window)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all B*T positions (callers validate 0 <= targets < V)."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), reduction="mean")


def training_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The objective loom trains: the mean cross-entropy plus, for a mixture of experts, every
    MoE layer's weighted balancing and z losses of this forward."""
    loss = lm_loss(model(inputs), targets)
    for module in model.modules():
        if getattr(module, "router_loss", None) is not None:
            loss = loss + module.router_loss
    return loss


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------
class Conv1D(nn.Module):
    """HF's GPT-2 "Conv1D": a linear layer stored transposed, weight [in, out], y = x @ W + b."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def split_heads(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, C] -> q, k, v each [B, H, T, C/H] (c_attn output is q | k | v, heads inside)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        f = lambda t: t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        return f(q), f(k), f(v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.split_heads(x)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.n_inner)
        self.c_proj = Conv1D(cfg.n_inner, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Transformer(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.config = cfg
        self.transformer = GPT2Transformer(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.config.n_positions:
            raise ValueError(f"sequence length {idx.shape[1]} > n_positions {self.config.n_positions}")
        h = self.transformer(idx.long())
        tied = self.config.tie_word_embeddings
        return torch.matmul(h, (self.transformer.wte.weight if tied else self.lm_head.weight).t())


# ----------------------------------------------------------------------------------------------
# Llama
# ----------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w, normalisation computed in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's long-context frequencies (the Llama 3 paper's RoPE scaling, as transformers'
    "llama3" rope_type documents it): with wavelength w = 2 pi / f and the original context L,
    high-frequency pairs (w < L / high_freq_factor) keep f, low-frequency ones (w > L /
    low_freq_factor) get f / factor, and those between interpolate linearly in L / w."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    L = scaling["original_max_position_embeddings"]
    out = []
    for f in inv_freq.tolist():
        w = 2 * math.pi / f
        if w < L / high:
            out.append(f)
        elif w > L / low:
            out.append(f / factor)
        else:
            s = (L / w - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rope_tables(T: int, head_dim: int, theta: float, dtype: torch.dtype,
                device=None, scaling: Optional[dict] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] in HF's rotate_half layout, computed in float64 then cast:
    inv_freq[j] = theta^(-2j/d) (j < d/2), angle[t, j] = t * inv_freq[j], tables = cat(a, a)."""
    j = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (j / head_dim))
    if scaling is not None:
        inv_freq = llama3_scaled(inv_freq, scaling)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, d] with cos/sin [T, d]."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, KV, T, d] -> [B, KV*n_rep, T, d]; query head h reads KV head h // n_rep."""
    if n_rep == 1:
        return x
    B, KV, T, d = x.shape
    return x[:, :, None].expand(B, KV, n_rep, T, d).reshape(B, KV * n_rep, T, d)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.window = 0  # the decoder layer sets its sliding window
        C, D = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(C, cfg.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(C, cfg.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(C, cfg.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * D, C, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Returns RoPE'd q [B, H, T, D] and k, v [B, KV, T, D] (k/v not yet repeated)."""
        B, T, _ = x.shape
        D, H, KV = self.cfg.head_dim, self.cfg.num_attention_heads, self.cfg.num_key_value_heads
        q = self.q_proj(x).reshape(B, T, H, D).transpose(1, 2)
        k = self.k_proj(x).reshape(B, T, KV, D).transpose(1, 2)
        v = self.v_proj(x).reshape(B, T, KV, D).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        y = causal_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), self.window)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        C, Fi = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(C, Fi, bias=False)
        self.up_proj = nn.Linear(C, Fi, bias=False)
        self.down_proj = nn.Linear(Fi, C, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(nn.Module):
    def __init__(self, cfg: LlamaConfig, width_multiple: int = 1):
        super().__init__()
        C, Fi = cfg.hidden_size, width_multiple * cfg.expert_size
        self.w1 = nn.Linear(C, Fi, bias=False)  # gate
        self.w3 = nn.Linear(C, Fi, bias=False)  # up
        self.w2 = nn.Linear(Fi, C, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    """HF MixtralSparseMoeBlock: softmax over the experts, top-k, weights renormalised over the
    chosen k. Options beyond Mixtral: the sigmoid router (DeepSeek-V3: sigmoid scores, top-k of
    scores + the `bias` buffer, which steers selection only; weights normalised), a capacity factor (an expert keeps its first ceil(c k T / E)
    (token, slot) pairs in token order), and the balancing and z losses per call:
      aux = E sum_i (slots routed to i / T) mean_t affinity_ti  (HF load_balancing_loss_func;
            affinity p for softmax, s / sum s for sigmoid; counts carry no gradient)
      z = mean_t logsumexp(logits_t)^2                        (ST-MoE eq. 5)"""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(cfg) for _ in range(cfg.num_local_experts))
        # DeepSeekMoE's shared experts: one MLP n_shared x as wide, for every token, unweighted.
        if cfg.n_shared_experts:
            self.shared_experts = MixtralExpert(cfg, cfg.n_shared_experts)
        self.register_buffer("bias", torch.zeros(cfg.num_local_experts), persistent=False)
        self.router_loss = self.aux = self.z = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        tokens, experts, k = x.shape[0], self.cfg.num_local_experts, self.cfg.num_experts_per_tok
        logits = self.gate(x)
        if self.cfg.moe_router == "softmax":
            probs = torch.softmax(logits, dim=-1)
            affinity = probs
        else:
            probs = torch.sigmoid(logits)
            affinity = probs / probs.sum(dim=-1, keepdim=True)
        score = probs.detach() + (self.bias if self.cfg.moe_router == "sigmoid" else 0)
        selected = torch.topk(score, k, dim=-1).indices
        chosen = probs.gather(1, selected)
        weights = chosen / chosen.sum(dim=-1, keepdim=True)
        cf = self.cfg.moe_capacity_factor
        capacity = tokens * k if cf == 0 else math.ceil(cf * k * tokens / experts)
        out = torch.zeros_like(x)
        counts = torch.zeros(experts, dtype=x.dtype)
        for i, expert in enumerate(self.experts):
            slots = [(t, q) for t in range(tokens) for q in range(k) if int(selected[t, q]) == i]
            counts[i] = len(slots)
            slots = slots[:capacity]
            if not slots:
                continue
            rows = torch.tensor([t for t, _ in slots])
            cols = torch.tensor([q for _, q in slots])
            out = out.index_add(0, rows, expert(x[rows]) * weights[rows, cols].unsqueeze(1))
        if self.cfg.n_shared_experts:
            out = out + self.shared_experts(x)
        self.aux = experts * ((counts / tokens) * affinity.mean(dim=0)).sum()
        self.z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
        self.router_loss = self.cfg.router_aux_loss_coef * self.aux + self.cfg.router_z_loss_coef * self.z
        return out.reshape(shape)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.self_attn.window = cfg.window_of(layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_moe_layer(layer):
            self.block_sparse_moe = MixtralSparseMoeBlock(cfg)
        else:
            self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        ffn = self.block_sparse_moe if self.cfg_moe() else self.mlp
        return x + ffn(self.post_attention_layernorm(x))

    def cfg_moe(self) -> bool:
        return hasattr(self, "block_sparse_moe")


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, l) for l in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        cos, sin = rope_tables(idx.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device,
                               self.cfg.rope_scaling)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {idx.shape[1]} > max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        h = self.model(idx.long())
        w = self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return torch.matmul(h, w.t())


# ----------------------------------------------------------------------------------------------
def build_model(cfg: Config, dtype: torch.dtype = torch.float32) -> nn.Module:
    model = GPT2LMHeadModel(cfg) if isinstance(cfg, GPT2Config) else LlamaForCausalLM(cfg)
    return model.to(dtype)


def random_init(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic non-trivial init: N(0, std) matrices/embeddings, norm weights 1 + N(0, 0.1),
    biases N(0, std), so every parameter influences the loss in a distinguishable way."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("bias"):
                v = std * r
            elif p.dim() == 1:  # LayerNorm / RMSNorm gains
                v = 1.0 + 0.1 * r
            else:
                v = std * r
            p.copy_(v.to(p.dtype))


def load_state(model: nn.Module, tensors: Dict[str, torch.Tensor]) -> None:
    """Copies HF-named tensors into the model's parameters (shapes must match; extras ignored)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = tensors[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)} != expected {tuple(p.shape)}")
            p.copy_(t.to(p.dtype))
