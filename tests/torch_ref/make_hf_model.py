#!/usr/bin/env python3
"""Writes a tiny model in Hugging Face's layout, built by the PyTorch reference (models.py), and
what it computes on a fixed batch, for `train.init_from` to be checked against.

  make_hf_model.py OUT_DIR llama|llama31|mixtral|gpt2

OUT_DIR gets config.json (transformers' keys), model.safetensors (HF names; for llama an untied
lm_head, GQA and a non-default rope_theta; gpt2 tied) and reference.safetensors with
"inputs" [B, T] (I32), "targets" [B, T] (I32), "logits" [B, T, V] and "loss" [] (F32, the mean
cross-entropy), all from the reference in float64 and stored as F32 so the comparison measures
loom's float32 arithmetic, not the reference's.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io  # noqa: E402

B, T = 3, 12


def config(arch):
    if arch == "llama31":
        # Llama 3.1's rope_scaling with an original context of 64 and theta 1e4 on head_dim 8:
        # the pairs' wavelengths 6.3, 63, 628 and 6283 fall in all three bands (kept below
        # 64 / 4 = 16, blended up to 64 / 1, divided by 8 above).
        c = config("llama")
        c.update({"rope_theta": 10000.0, "max_position_embeddings": 128,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
        return c
    if arch == "mixtral":
        # Mixtral: 4 SwiGLU experts, top-2 softmax routing, no balancing loss in the logits.
        c = config("llama")
        c.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                  "num_experts_per_tok": 2, "sliding_window": None})
        return c
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
                "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
                "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                "hidden_act": "silu", "torch_dtype": "float32"}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 96, "n_positions": 32,
            "n_embd": 32, "n_layer": 2, "n_head": 4, "layer_norm_epsilon": 1e-5,
            "activation_function": "gelu_new", "tie_word_embeddings": True, "torch_dtype": "float32"}


def main():
    out, arch = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    cfg_dict = config(arch)
    cfg = models.config_from_dict(cfg_dict)
    model = models.build_model(cfg, torch.float64)
    models.random_init(model, seed=5, std=0.1)
    # The file holds float32 weights; the reference computes with exactly those, in float64.
    state = {name: p.detach().to(torch.float32) for name, p in model.named_parameters()}
    models.load_state(model, {k: v.to(torch.float64) for k, v in state.items()})
    g = torch.Generator().manual_seed(9)
    inputs = torch.randint(0, cfg_dict["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, cfg_dict["vocab_size"], (B, T), generator=g)
    with torch.no_grad():
        logits = model(inputs)
        loss = models.lm_loss(logits, targets)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    safetensors_io.write(os.path.join(out, "model.safetensors"), state, {"format": "pt"})
    safetensors_io.write(os.path.join(out, "reference.safetensors"),
                         {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32),
                          "logits": logits.to(torch.float32), "loss": loss.to(torch.float32).reshape(())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
