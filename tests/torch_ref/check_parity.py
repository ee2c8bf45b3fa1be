#!/usr/bin/python3
"""Parity checker: compares a dump written by loom's C++ engine with an independent PyTorch
reference (tests/torch_ref/models.py).

Usage:  /usr/bin/python3 tests/torch_ref/check_parity.py DIR [--verbose] [--grads-only]
                                                             [--dtype float32|float64] [--threads N]
                                                             [--strict-weights]

The dump contract (DIR):
  config.json          HF-style config; "model_type" is "gpt2" or "llama" (keys: see models.py)
  model.safetensors    initial weights, F32, every parameter under its HF name and HF layout
                       (GPT-2 Conv1D weights [in, out]; Llama nn.Linear weights [out, in]).
                       Tied GPT-2 / tied Llama have no lm_head.weight.
  batch.safetensors    "inputs" I32 [B, T], "targets" I32 [B, T]   (0 <= id < vocab_size,
                       T <= n_positions / max_position_embeddings)
  grads.safetensors    F32 gradient of every parameter (same names/shapes as model.safetensors)
                       after ONE forward/backward of the mean cross-entropy over all B*T
                       positions on the batch, from the initial weights; plus "loss" F32 [1]
  train.json           {"steps": int, "lr": float, "beta1": float, "beta2": float, "eps": float,
                        "weight_decay": float, "grad_clip": float (0 = off),
                        "decay_params": [HF names that get weight decay]}
  trained.safetensors  F32 weights after `steps` AdamW steps from the initial weights; each step:
                       zero grads, forward/backward on the same batch, clip the global L2 grad
                       norm to grad_clip if > 0 (torch.nn.utils.clip_grad_norm_), then
                       torch.optim.AdamW with constant lr (decoupled decay p -= lr*wd*p for
                       decay_params only, bias-corrected moments, eps added to sqrt(v_hat)).

Tolerances (a = C++ value, b = PyTorch reference value, both promoted to float64):
  rel_err(a, b) = max|a - b| / max(max|b|, 1e-8)          (max over all elements of a tensor)
  loss:            rel_err <= 1e-5
  each gradient:   rel_err <= 1e-4
  each trained weight tensor (after `steps` AdamW steps): rel_err <= 1e-4 over its
                   well-conditioned elements (below)
  Any NaN/Inf in a C++ tensor fails that tensor. The reference runs on CPU, deterministic
  algorithms, 1 thread, float32 by default.

  Ill-conditioned weight elements. Adam divides each gradient element by its own RMS, so an
  element whose gradient float32 cannot resolve moves by O(lr) per step in a direction decided by
  rounding; e.g. GPT-2's key bias, whose exact gradient is 0 (softmax ignores the per-row constant
  q.b_k) but comes out ~1e-9 (~eps) in float32. No float32 implementation can reproduce such an
  element to 1e-4 (even the exact float64 answer fails: see selftest), so the checker also trains
  the reference in float64, recomputes the gradient in float32 at the same weights at every step,
  and calls element i ill-conditioned when
    (a) at some step |g32_i - g64_i| > 1e-4 * (|g64_i| + eps)  (float32 cannot give its Adam
        step to 1e-4; elements whose gradient is exactly 0 in both, e.g. unused embedding rows,
        are exact and stay fully checked), or
    (b) |ref32_i - ref64_i| > 0.05 * 1e-4 * max|ref32|  (the float32 reference cannot reproduce
        the float64 one to a twentieth of the tolerance).
  Typically 1-3% of elements are ill-conditioned. They are held only to
  |a_i - ref32_i| <= 1e-4 * max|ref32| + 2*lr*steps (Adam moves an element by ~lr per step at
  most); their count per tensor is printed (column "ill"). Optimizer bugs are systematic and show
  up on the well-conditioned elements (selftest proves it for weight decay on all tensors, missing
  bias correction, eps inside the sqrt, and ignored clipping). --strict-weights drops the
  exemption and applies rel_err to every element (the raw metric; expect spurious failures).

Exit status: 0 every check passed; 1 some check failed (or the checker itself crashed);
2 malformed dump (missing file/tensor, wrong shape/dtype, bad JSON/config, token out of range).
A gradient missing from grads.safetensors is a malformed dump (exit 2), never a pass.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import safetensors_io as st  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
WEIGHT_RTOL = 1e-4
DENOM_FLOOR = 1e-8
# Trained-weight element i is ill-conditioned (see docstring) when |ref32 - ref64| >
# ILL_FRACTION * WEIGHT_RTOL * scale, or when its float32 gradient is ever off by
# > NOISE_LEVEL * (|g64| + eps).
ILL_FRACTION = 0.05
NOISE_LEVEL = 1e-4

EXIT_PASS, EXIT_FAIL, EXIT_MALFORMED = 0, 1, 2

FILES = ("config.json", "model.safetensors", "batch.safetensors", "grads.safetensors",
         "train.json", "trained.safetensors")
TRAIN_FILES = ("train.json", "trained.safetensors")


class DumpError(Exception):
    """The dump is malformed (exit 2)."""


def rel_err(a: torch.Tensor, b: torch.Tensor) -> Tuple[float, float]:
    """(max|a-b|, max|a-b| / max(max|b|, 1e-8)); b is the reference. NaN/Inf in a -> inf."""
    a64, b64 = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    if a64.numel() == 0:
        return 0.0, 0.0
    if not torch.isfinite(a64).all():
        return math.inf, math.inf
    diff = (a64 - b64).abs().max().item()
    scale = max(b64.abs().max().item(), DENOM_FLOOR)
    return diff, diff / scale


def weight_err(a: torch.Tensor, b: torch.Tensor, probe: Optional[torch.Tensor],
               noisy: Optional[torch.Tensor], allowance: float, rtol: float = WEIGHT_RTOL
               ) -> Tuple[float, float, int, bool]:
    """Trained-weight comparison. b: reference, probe: the reference at the other precision,
    noisy: mask of noise-level-gradient elements (both None = strict). Returns (max|a-b| and
    rel_err over well-conditioned elements, number of ill-conditioned elements, whether all
    ill-conditioned ones are within rtol*scale + allowance)."""
    a64, b64 = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    if a64.numel() == 0:
        return 0.0, 0.0, 0, True
    if not torch.isfinite(a64).all():
        return math.inf, math.inf, 0, False
    scale = max(b64.abs().max().item(), DENOM_FLOOR)
    diff = (a64 - b64).abs()
    if probe is None:
        ill = torch.zeros_like(diff, dtype=torch.bool)
    else:
        ill = (b64 - probe.detach().double().reshape(-1)).abs() > ILL_FRACTION * rtol * scale
    if noisy is not None:
        ill = ill | noisy.reshape(-1)
    well = diff[~ill]
    d = well.max().item() if well.numel() else 0.0
    ill_ok = bool((diff[ill] <= rtol * scale + allowance).all())
    return d, d / scale, int(ill.sum()), ill_ok


@dataclass
class Row:
    group: str
    name: str
    max_abs: float
    rel: float
    tol: float
    n_ill: int = 0      # ill-conditioned elements (weights only)
    ill_ok: bool = True

    @property
    def ok(self) -> bool:
        return self.rel <= self.tol and self.ill_ok  # False for NaN


# ----------------------------------------------------------------------------------------------
# Loading and validating the dump
# ----------------------------------------------------------------------------------------------
def _read_st(path: str) -> Dict[str, torch.Tensor]:
    try:
        tensors, _ = st.read(path)
    except st.SafetensorsError as e:
        raise DumpError(str(e)) from None
    return tensors


def _check_params(tensors: Dict[str, torch.Tensor], shapes: Dict[str, Tuple[int, ...]], file: str,
                  warnings: List[str], allowed_extra=()) -> None:
    missing = [n for n in shapes if n not in tensors]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise DumpError(f"{file}: missing {len(missing)} of {len(shapes)} parameter tensors: "
                        f"{', '.join(missing[:5])}{more}")
    for n, shape in shapes.items():
        t = tensors[n]
        if tuple(t.shape) != shape:
            raise DumpError(f"{file}: '{n}' has shape {list(t.shape)}, expected {list(shape)}")
        if not t.is_floating_point():
            raise DumpError(f"{file}: '{n}' has dtype {st.dtype_tag(t.dtype)}, expected F32")
        if t.dtype != torch.float32:
            warnings.append(f"{file}: '{n}' is {st.dtype_tag(t.dtype)}, contract says F32")
    extra = sorted(set(tensors) - set(shapes) - set(allowed_extra))
    if extra:
        warnings.append(f"{file}: ignoring {len(extra)} unexpected tensors: {', '.join(extra[:5])}")


def _batch_tensor(batch: Dict[str, torch.Tensor], name: str, vocab: int, max_t: int) -> torch.Tensor:
    if name not in batch:
        raise DumpError(f"batch.safetensors: missing tensor '{name}'")
    t = batch[name]
    if t.dtype not in (torch.int32, torch.int64):
        raise DumpError(f"batch.safetensors: '{name}' is {st.dtype_tag(t.dtype)}, expected I32")
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise DumpError(f"batch.safetensors: '{name}' has shape {list(t.shape)}, expected [B, T]")
    if t.shape[1] > max_t:
        raise DumpError(f"batch.safetensors: T={t.shape[1]} exceeds the model's {max_t} positions")
    lo, hi = t.min().item(), t.max().item()
    if lo < 0 or hi >= vocab:
        raise DumpError(f"batch.safetensors: '{name}' has ids in [{lo}, {hi}], vocab_size is {vocab}")
    return t.long()


def _train_cfg(path: str, param_names: List[str]) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise DumpError(f"train.json: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise DumpError("train.json: not a JSON object")

    def num(key, lo, hi=math.inf, lo_open=False, hi_open=False):
        if key not in d:
            raise DumpError(f"train.json: missing key '{key}'")
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi):
            raise DumpError(f"train.json: '{key}' = {v!r} is out of range")
        return float(v)

    out = {"lr": num("lr", 0.0), "beta1": num("beta1", 0.0, 1.0, hi_open=True),
           "beta2": num("beta2", 0.0, 1.0, hi_open=True), "eps": num("eps", 0.0, lo_open=True),
           "weight_decay": num("weight_decay", 0.0), "grad_clip": num("grad_clip", 0.0)}
    steps = d.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise DumpError(f"train.json: 'steps' = {steps!r} must be a non-negative integer")
    out["steps"] = steps
    dp = d.get("decay_params")
    if not isinstance(dp, list) or not all(isinstance(n, str) for n in dp):
        raise DumpError("train.json: 'decay_params' must be a list of parameter names")
    unknown = sorted(set(dp) - set(param_names))
    if unknown:
        raise DumpError(f"train.json: decay_params names unknown parameters: {', '.join(unknown[:5])}")
    if len(set(dp)) != len(dp):
        raise DumpError("train.json: decay_params has duplicates")
    out["decay_params"] = set(dp)
    return out


# ----------------------------------------------------------------------------------------------
# Reference computations
# ----------------------------------------------------------------------------------------------
def reference_grads(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    loss = models.training_loss(model, inputs, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), grads


def reference_train(model, inputs, targets, tc, on_grads: Optional[Callable] = None
                    ) -> Tuple[Dict[str, torch.Tensor], List[float]]:
    """AdamW training as the contract says; returns (final weights, global grad norm per step).
    on_grads(named_params, clip_coef) is called after each backward, before clipping."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if n in tc["decay_params"]]
    no_decay = [p for n, p in named if n not in tc["decay_params"]]
    groups = [g for g in ({"params": decay, "weight_decay": tc["weight_decay"]},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    opt = torch.optim.AdamW(groups, lr=tc["lr"], betas=(tc["beta1"], tc["beta2"]), eps=tc["eps"],
                            amsgrad=False, foreach=False, maximize=False)
    params = [p for _, p in named]
    norms = []
    for _ in range(tc["steps"]):
        opt.zero_grad(set_to_none=True)
        models.training_loss(model, inputs, targets).backward()
        norm = float(torch.norm(torch.stack([p.grad.detach().norm() for p in params])))
        norms.append(norm)
        if on_grads is not None:
            on_grads(named, min(1.0, tc["grad_clip"] / (norm + 1e-6)) if tc["grad_clip"] > 0 else 1.0)
        if tc["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, tc["grad_clip"])
        opt.step()
    return {n: p.detach().clone() for n, p in named}, norms


def noisy_gradient_mask(cfg, init, inputs, targets, tc) -> Tuple[Dict[str, torch.Tensor],
                                                                  Dict[str, torch.Tensor]]:
    """Trains in float64 and, at every step, recomputes the gradient in float32 at the same
    (rounded) weights. Returns (float64 trained weights, {name: mask}) where mask marks elements
    whose float32 gradient is off by more than NOISE_LEVEL * (|g64| + eps) at some step, i.e.
    whose Adam step float32 rounding can visibly change (g64 and g32 both exactly 0 is exact)."""
    m64 = models.build_model(cfg, torch.float64)
    m32 = models.build_model(cfg, torch.float32)
    models.load_state(m64, init)
    mask: Dict[str, torch.Tensor] = {}

    def probe(named64, coef):
        models.load_state(m32, {n: p.detach() for n, p in named64})
        m32.zero_grad(set_to_none=True)
        models.training_loss(m32, inputs, targets).backward()
        g32 = dict(m32.named_parameters())
        for n, p in named64:
            g = p.grad.detach()
            err = (g32[n].grad.detach().double() - g).abs() * coef
            bad = err > NOISE_LEVEL * (g.abs() * coef + tc["eps"])
            mask[n] = bad if n not in mask else mask[n] | bad

    trained64, _ = reference_train(m64, inputs, targets, tc, probe)
    for n, _ in m64.named_parameters():
        mask.setdefault(n, torch.zeros(init[n].shape, dtype=torch.bool))
    return trained64, mask


# ----------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:.3e}" if math.isfinite(x) else str(x)


def _print_table(rows: List[Row]) -> None:
    w = max([len(r.name) for r in rows] + [4])
    print(f"  {'group':<7} {'name':<{w}}  {'max abs diff':>12}  {'rel err':>10}  {'tol':>8}  {'ill':>5}")
    for r in rows:
        verdict = "ok" if r.ok else ("FAIL" if not r.rel <= r.tol
                                     else "FAIL (ill-conditioned element beyond tol + 2*lr*steps)")
        print(f"  {r.group:<7} {r.name:<{w}}  {_fmt(r.max_abs):>12}  {_fmt(r.rel):>10}  "
              f"{r.tol:>8.0e}  {r.n_ill if r.group == 'weight' else '':>5}  {verdict}")


def run(dump: str, verbose: bool = False, grads_only: bool = False,
        dtype: torch.dtype = torch.float32, strict_weights: bool = False) -> int:
    warnings: List[str] = []
    if not os.path.isdir(dump):
        raise DumpError(f"{dump}: not a directory")
    for f in FILES:
        if grads_only and f in TRAIN_FILES:
            continue
        if not os.path.isfile(os.path.join(dump, f)):
            raise DumpError(f"{dump}: missing file {f}")
    path = lambda f: os.path.join(dump, f)

    try:
        cfg = models.load_config(path("config.json"))
    except models.ConfigError as e:
        raise DumpError(f"config.json: {e}") from None
    shapes = models.expected_parameter_shapes(cfg)
    model = models.build_model(cfg, dtype)
    mshapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert mshapes == shapes, "internal: models.py parameters disagree with expected_parameter_shapes"
    names = list(shapes)
    tied_extra = ("lm_head.weight",)  # HF state dicts of tied models may carry the tied alias

    init = _read_st(path("model.safetensors"))
    _check_params(init, shapes, "model.safetensors", warnings, tied_extra)
    for n in names:
        if not torch.isfinite(init[n]).all():
            raise DumpError(f"model.safetensors: '{n}' contains NaN/Inf")
    max_t = cfg.n_positions if isinstance(cfg, models.GPT2Config) else cfg.max_position_embeddings
    batch = _read_st(path("batch.safetensors"))
    inputs = _batch_tensor(batch, "inputs", cfg.vocab_size, max_t)
    targets = _batch_tensor(batch, "targets", cfg.vocab_size, max_t)
    if inputs.shape != targets.shape:
        raise DumpError(f"batch.safetensors: inputs {list(inputs.shape)} vs targets {list(targets.shape)}")
    grads = _read_st(path("grads.safetensors"))
    if "loss" not in grads:
        raise DumpError("grads.safetensors: missing tensor 'loss'")
    if grads["loss"].numel() != 1 or not grads["loss"].is_floating_point():
        raise DumpError(f"grads.safetensors: 'loss' must be F32 [1], got "
                        f"{st.dtype_tag(grads['loss'].dtype)}{list(grads['loss'].shape)}")
    _check_params(grads, shapes, "grads.safetensors", warnings, ("loss",) + tied_extra)
    tc = trained = None
    if not grads_only:
        tc = _train_cfg(path("train.json"), names)
        trained = _read_st(path("trained.safetensors"))
        _check_params(trained, shapes, "trained.safetensors", warnings, tied_extra)

    arch = ("gpt2 L={0.n_layer} C={0.n_embd} H={0.n_head} F={0.n_inner} V={0.vocab_size} "
             "tied={0.tie_word_embeddings}"
            if isinstance(cfg, models.GPT2Config) else
            "llama L={0.num_hidden_layers} C={0.hidden_size} H={0.num_attention_heads} "
            "KV={0.num_key_value_heads} F={0.intermediate_size} V={0.vocab_size} "
            "tied={0.tie_word_embeddings}").format(cfg)
    nparam = sum(math.prod(s) for s in shapes.values())
    print(f"check_parity: {dump}")
    print(f"  model {arch}; {len(names)} tensors, {nparam} parameters; batch B={inputs.shape[0]} "
          f"T={inputs.shape[1]}; reference {str(dtype).replace('torch.', '')} cpu "
          f"threads={torch.get_num_threads()}")
    for w in warnings:
        print(f"  warning: {w}")

    rows: List[Row] = []
    ill_note = None
    # 1) loss and gradients of one forward/backward from the initial weights
    models.load_state(model, init)
    ref_loss, ref_grads = reference_grads(model, inputs, targets)
    cpp_loss = grads["loss"].reshape(1)
    d, r = rel_err(cpp_loss, ref_loss.reshape(1))
    rows.append(Row("loss", "loss", d, r, LOSS_RTOL))
    print(f"  loss: cpp {cpp_loss.item():.8f}  ref {ref_loss.item():.8f}  rel err {_fmt(r)}")
    for n in names:
        d, r = rel_err(grads[n], ref_grads[n])
        rows.append(Row("grad", n, d, r, GRAD_RTOL))

    # 2) weights after `steps` AdamW steps
    if not grads_only:
        models.load_state(model, init)
        ref_trained, norms = reference_train(model, inputs, targets, tc)
        probe = noisy = None
        if not strict_weights:  # float64 training, to find ill-conditioned elements
            trained64, noisy = noisy_gradient_mask(cfg, init, inputs, targets, tc)
            probe = trained64
            if dtype != torch.float32:  # the reference is float64: probe with float32
                m32 = models.build_model(cfg, torch.float32)
                models.load_state(m32, init)
                probe, _ = reference_train(m32, inputs, targets, tc)
        allowance = 2.0 * tc["lr"] * tc["steps"]
        if norms:
            print(f"  train: {tc['steps']} AdamW steps lr={tc['lr']:g} betas=({tc['beta1']:g}, "
                  f"{tc['beta2']:g}) eps={tc['eps']:g} wd={tc['weight_decay']:g} on "
                  f"{len(tc['decay_params'])} tensors, grad_clip={tc['grad_clip']:g}; ref grad norm "
                  f"{norms[0]:.4g} -> {norms[-1]:.4g}")
        for n in names:
            d, r, n_ill, ill_ok = weight_err(trained[n], ref_trained[n],
                                             None if probe is None else probe[n],
                                             None if noisy is None else noisy[n], allowance)
            rows.append(Row("weight", n, d, r, WEIGHT_RTOL, n_ill, ill_ok))
        ill_total = sum(r.n_ill for r in rows if r.group == "weight")
        if probe is not None:
            ill_note = (f"  ill-conditioned: {ill_total} of {nparam} weight elements (float32 gradient "
                        f"off by > {NOISE_LEVEL:g}*(|g64|+eps) at some step, or reference float32 vs "
                        f"float64 differ by > {ILL_FRACTION:g}*tol); held to |diff| <= tol*max|ref| + "
                        f"2*lr*steps = tol*max|ref| + {allowance:g}")

    failed = [r for r in rows if not r.ok]
    for group in ("grad", "weight"):
        g = [r for r in rows if r.group == group]
        if g:
            worst = max(g, key=lambda r: (not r.ok, r.rel if r.rel == r.rel else math.inf))
            print(f"  {group}s: {sum(r.ok for r in g)}/{len(g)} within rel {g[0].tol:g}; "
                  f"worst {worst.name} rel {_fmt(worst.rel)}"
                  + (" (well-conditioned elements)" if group == "weight" and not strict_weights else ""))
    if ill_note:
        print(ill_note)
    if verbose:
        print("  all checks:")
        _print_table(rows)
    if failed:
        print(f"  FAILURES ({len(failed)}):")
        _print_table(failed)
        print(f"SUMMARY: FAIL - {len(failed)} of {len(rows)} checks out of tolerance "
              f"(loss rel<={LOSS_RTOL:g}, grad rel<={GRAD_RTOL:g}, weight rel<={WEIGHT_RTOL:g})")
        return EXIT_FAIL
    print(f"SUMMARY: PASS - all {len(rows)} checks within tolerance "
          f"(loss rel<={LOSS_RTOL:g}, grad rel<={GRAD_RTOL:g}, weight rel<={WEIGHT_RTOL:g})")
    return EXIT_PASS


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="dump directory written by loom")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every comparison")
    ap.add_argument("--grads-only", action="store_true",
                    help="check loss and gradients only (train.json/trained.safetensors not needed)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="reference precision (default float32)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--strict-weights", action="store_true",
                    help="apply rel_err to every trained-weight element (no ill-conditioning allowance)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True)
    try:
        return run(args.dir, args.verbose, args.grads_only, getattr(torch, args.dtype),
                   args.strict_weights)
    except DumpError as e:
        print(f"check_parity: MALFORMED DUMP: {e}")
        print("SUMMARY: MALFORMED")
        return EXIT_MALFORMED
    except Exception:  # a checker bug must never read as a pass
        traceback.print_exc()
        print("SUMMARY: ERROR (checker crashed)")
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
