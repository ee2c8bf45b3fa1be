#!/usr/bin/python3
"""loom's mixture-of-experts layer (model/moe.hpp) against the PyTorch reference of the tiny-model
parity test (models.py's MixtralSparseMoeBlock, written from the papers' and Hugging Face's
definitions, not from loom), in float64 with autograd.

Usage:  /usr/bin/python3 tests/torch_ref/check_moe_layer.py DIR

DIR holds what loom wrote:
  moe.json           {"router": "softmax"|"sigmoid", "top_k": k, "capacity_factor": c (0 dropless),
                      "aux_scale": a, "z_scale": z}
  inputs.safetensors "x" [T, C], "probe" [T, C], "bias" [E] (the sigmoid router's selection bias),
                     and the layer's weights under their Mixtral names: "gate.weight" [E, C],
                     "experts.i.w1.weight" [F, C], "experts.i.w3.weight" [F, C],
                     "experts.i.w2.weight" [C, F], optionally "shared_experts.w1/w3/w2.weight"
  loom.safetensors   loom's "out" [T, C], "aux" [1], "z" [1], "d_x" [T, C] and the gradient of
                     every weight (same names) of  L = sum(out * probe) + a * aux + z * z_loss

The block's semantics are in MixtralSparseMoeBlock's docstring. Tolerances (loom is f32): out,
aux and z 1e-5, every gradient 1e-4, each relative to the reference tensor's largest magnitude.
Exit 0 on a match, 1 on a mismatch, 2 on a bad dump.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io  # noqa: E402


def main(directory: str) -> int:
    try:
        config = json.load(open(os.path.join(directory, "moe.json")))
        inputs, _ = safetensors_io.read(os.path.join(directory, "inputs.safetensors"))
        loom, _ = safetensors_io.read(os.path.join(directory, "loom.safetensors"))
    except (OSError, ValueError) as e:
        print(f"bad dump: {e}")
        return 2
    torch.set_num_threads(1)
    d = torch.float64
    x = inputs["x"].to(d).requires_grad_(True)
    probe = inputs["probe"].to(d)
    experts, dim = inputs["gate.weight"].shape
    width = inputs["experts.0.w1.weight"].shape[0]
    shared = "shared_experts.w1.weight" in inputs
    cfg = models.LlamaConfig(
        vocab_size=1, hidden_size=dim, intermediate_size=width, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, max_position_embeddings=1, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, model_type="mixtral", num_local_experts=experts,
        num_experts_per_tok=int(config["top_k"]), router_aux_loss_coef=float(config["aux_scale"]),
        router_z_loss_coef=float(config["z_scale"]), moe_router=config["router"],
        moe_capacity_factor=float(config["capacity_factor"]),
        n_shared_experts=inputs["shared_experts.w1.weight"].shape[0] // width if shared else 0)
    block = models.MixtralSparseMoeBlock(cfg).to(d)
    models.load_state(block, inputs)
    block.bias.copy_(inputs["bias"].to(d))
    out = block(x)
    ((out * probe).sum() + block.router_loss).backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)) for name, p in block.named_parameters()}

    failures = 0

    def check(name, got, want, tol):
        nonlocal failures
        got = got.to(d).reshape(want.shape)
        scale = max(want.abs().max().item(), 1e-8)
        err = (got - want).abs().max().item() / scale
        ok = err <= tol and torch.isfinite(got).all().item()
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:24s} rel err {err:.2e} (tolerance {tol:.0e})")

    try:
        check("out", loom["out"], out.detach(), 1e-5)
        check("aux", loom["aux"], block.aux.detach().reshape(1), 1e-5)
        check("z", loom["z"], block.z.detach().reshape(1), 1e-5)
        check("d_x", loom["d_x"], x.grad, 1e-4)
        for name, grad in grads.items():
            check(name, loom[name], grad, 1e-4)
    except KeyError as e:
        print(f"bad dump: missing {e}")
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
