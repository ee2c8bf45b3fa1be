#!/usr/bin/python3
"""An independent PyTorch reference of loom's mixture-of-experts layer (model/moe.hpp), in
float64 with autograd, written from the papers' and Hugging Face's definitions, not from loom.

Usage:  /usr/bin/python3 tests/torch_ref/check_moe_layer.py DIR

DIR holds what loom wrote:
  moe.json           {"router": "softmax"|"sigmoid", "top_k": k, "capacity_factor": c (0 dropless),
                      "aux_scale": a, "z_scale": z}
  inputs.safetensors "x" [T, C], "probe" [T, C], "bias" [E], and the layer's weights under
                     their Mixtral names: "gate.weight" [E, C], "experts.i.w1.weight" [F, C],
                     "experts.i.w3.weight" [F, C], "experts.i.w2.weight" [C, F]
  loom.safetensors   loom's "out" [T, C], "aux" [1], "z" [1], "d_x" [T, C] and the gradient of
                     every weight (same names) of  L = sum(out * probe) + a * aux + z * z_loss

The reference:
  logits = x W_r^T
  softmax router (HF MixtralSparseMoeBlock): p = softmax(logits); top-k of p; weights = p_sel / sum
  sigmoid router (DeepSeek-V3 sec. 2.1.2): s = sigmoid(logits); top-k of s + bias; weights = s_sel / sum
  expert i: w2(silu(w1 x) * w3 x); out_t = sum over its kept slots of weight * expert(x_t)
  shared experts (when "shared_experts.w1.weight" is given): + w2(silu(w1 x) * w3 x) for every token
  capacity c > 0: expert i keeps its first ceil(c k T / E) slots in (token, slot) order
  aux = E * sum_i (slots routed to i / T) * mean_t affinity_ti   (HF load_balancing_loss_func;
        affinity: p for softmax, s / sum_e s for sigmoid; the counts carry no gradient)
  z = mean_t logsumexp(logits_t)^2                                (ST-MoE eq. 5)
Tolerances (loom is f32): out, aux and z 1e-5, every gradient 1e-4, each relative to the
reference tensor's largest magnitude. Exit 0 on a match, 1 on a mismatch, 2 on a bad dump.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
    bias = inputs["bias"].to(d)
    router = inputs["gate.weight"].to(d).requires_grad_(True)
    experts = router.shape[0]
    w1 = [inputs[f"experts.{i}.w1.weight"].to(d).requires_grad_(True) for i in range(experts)]
    w3 = [inputs[f"experts.{i}.w3.weight"].to(d).requires_grad_(True) for i in range(experts)]
    w2 = [inputs[f"experts.{i}.w2.weight"].to(d).requires_grad_(True) for i in range(experts)]
    shared = None
    if "shared_experts.w1.weight" in inputs:  # DeepSeekMoE's always-on MLP
        shared = [inputs[f"shared_experts.{n}.weight"].to(d).requires_grad_(True) for n in ("w1", "w3", "w2")]
    k, cf = int(config["top_k"]), float(config["capacity_factor"])
    tokens = x.shape[0]

    logits = x @ router.T
    if config["router"] == "softmax":
        probs = torch.softmax(logits, dim=-1)
        selected = torch.topk(probs.detach(), k, dim=-1).indices
        affinity = probs
    else:
        probs = torch.sigmoid(logits)
        selected = torch.topk(probs.detach() + bias, k, dim=-1).indices
        affinity = probs / probs.sum(dim=-1, keepdim=True)
    chosen = probs.gather(1, selected)
    weights = chosen / chosen.sum(dim=-1, keepdim=True)

    capacity = tokens * k if cf == 0 else math.ceil(cf * k * tokens / experts)
    out = torch.zeros_like(x)
    counts = torch.zeros(experts, dtype=d)
    for i in range(experts):
        slots = [(t, s) for t in range(tokens) for s in range(k) if int(selected[t, s]) == i]
        counts[i] = len(slots)
        slots = slots[:capacity]
        if not slots:
            continue
        rows = torch.tensor([t for t, _ in slots])
        cols = torch.tensor([s for _, s in slots])
        h = x[rows]
        y = (torch.nn.functional.silu(h @ w1[i].T) * (h @ w3[i].T)) @ w2[i].T
        out = out.index_add(0, rows, y * weights[rows, cols].unsqueeze(1))
    if shared is not None:
        out = out + (torch.nn.functional.silu(x @ shared[0].T) * (x @ shared[1].T)) @ shared[2].T
    aux = experts * ((counts / tokens) * affinity.mean(dim=0)).sum()
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    loss = (out * probe).sum() + config["aux_scale"] * aux + config["z_scale"] * z
    loss.backward()

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
        check("aux", loom["aux"], aux.detach().reshape(1), 1e-5)
        check("z", loom["z"], z.detach().reshape(1), 1e-5)
        check("d_x", loom["d_x"], x.grad, 1e-4)
        check("gate.weight", loom["gate.weight"], router.grad, 1e-4)
        for i in range(experts):
            for name, w in (("w1", w1[i]), ("w3", w3[i]), ("w2", w2[i])):
                grad = w.grad if w.grad is not None else torch.zeros_like(w)
                check(f"experts.{i}.{name}.weight", loom[f"experts.{i}.{name}.weight"], grad, 1e-4)
        if shared is not None:
            for name, w in zip(("w1", "w3", "w2"), shared):
                check(f"shared_experts.{name}.weight", loom[f"shared_experts.{name}.weight"], w.grad, 1e-4)
    except KeyError as e:
        print(f"bad dump: missing {e}")
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
