#!/usr/bin/python3
"""loom's FP8 linear layer (model/fp8_linear.hpp) against a PyTorch reference doing the same
quantise-dequantise per recipe, written here from Transformer Engine's and DeepSeek-V3's
definitions: scale = fp8_max / amax / 2^margin in float32, q(x) = fp8(x * scale) * (1 / scale),
fp8() the nearest value of the format's table (ties to the even code, saturating), then the
GEMMs in float64 on the dequantised operands.

Two steps were run. Step 1 (empty history) scales by the current amax in every recipe but
blockwise; step 2 by the recipe's rule: current amax, the history (step 1's amax: delayed), or
a scale per 1 x 128 tile of input and output gradient and per 128 x 128 block of the weight
(blockwise), whose weight gradient takes the input and the output gradient quantised again in
128 x 1 tiles (128 consecutive rows of one column; DeepSeek-V3's, and Transformer Engine's
column-wise copies), tiles that stop at each sequence's end (case.json's "sequence_rows", 0: none).

Usage:  /usr/bin/python3 tests/torch_ref/check_fp8_linear.py DIR
DIR: case.json {"recipe", "format", "margin", "sequence_rows"}, inputs.safetensors (x1, w1, g1, x2, w2, g2, b: the
inputs, weights and output gradients of the two steps, and the bias), loom.safetensors (out, d_x,
d_w, d_b of step 2, and history [3, 2]: the newest two amaxes of input, weight, gradient).
Tolerance 1e-5 of each tensor's largest magnitude (loom accumulates in f32); histories exact.
The unquantised products must miss the reference by over 100x that, or the check could not fail.
Exit 0 on a match, 1 on a mismatch, 2 on a bad dump.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

F32 = torch.float32
SPECS = {"e4m3": (4, 3, 7, False), "e5m2": (5, 2, 15, True)}  # exponent bits, mantissa bits, bias, inf


def table(name):
    """Sorted non-negative finite values of the format, float64 (code order = value order)."""
    e_bits, m_bits, bias, ieee = SPECS[name]
    values = []
    for code in range(128):
        field, mant = code >> m_bits, code & ((1 << m_bits) - 1)
        top = (1 << e_bits) - 1
        if (ieee and field == top) or (not ieee and field == top and mant == (1 << m_bits) - 1):
            continue
        if field == 0:
            values.append(mant / (1 << m_bits) * 2.0 ** (1 - bias))
        else:
            values.append((1 + mant / (1 << m_bits)) * 2.0 ** (field - bias))
    return torch.tensor(values, dtype=torch.float64)


TABLES = {n: table(n) for n in SPECS}


def round_fp8(v, name):
    """Nearest table value, ties to the even code, saturating; v float32 -> float32."""
    t = TABLES[name]
    a = v.abs().to(torch.float64).clamp(max=float(t[-1]))
    hi_i = torch.searchsorted(t, a).clamp(max=len(t) - 1)
    lo_i = (hi_i - 1).clamp(min=0)
    lo_i = torch.where(t[hi_i] == a, hi_i, lo_i)
    d_lo, d_hi = a - t[lo_i], t[hi_i] - a
    pick = torch.where(d_lo < d_hi, lo_i, torch.where(d_hi < d_lo, hi_i, torch.where(lo_i % 2 == 0, lo_i, hi_i)))
    return (t[pick] * torch.sign(v.to(torch.float64))).to(F32)


def scale_of(amax, name, margin):
    amax = torch.as_tensor(amax, dtype=F32)
    if not (amax > 0):
        return torch.tensor(1.0, dtype=F32)
    scale = torch.tensor(float(TABLES[name][-1]), dtype=F32) / amax * (2.0 ** -margin)
    return torch.tensor(torch.finfo(F32).max, dtype=F32) if torch.isinf(scale) else scale


def qdq(x, scale, name):
    return round_fp8(x * scale, name) * (torch.tensor(1.0, dtype=F32) / scale)


def qdq_tiles(x, tile_rows, name, margin, tile=128):
    out = torch.empty_like(x)
    for r in range(0, x.shape[0], tile_rows):
        for c in range(0, x.shape[1], tile):
            block = x[r:r + tile_rows, c:c + tile]
            out[r:r + tile_rows, c:c + tile] = qdq(block, scale_of(block.abs().max(), name, margin), name)
    return out


def qdq_column_tiles(x, name, margin, sequence_rows, tile=128):
    """128 x 1 tiles: each column's rows in runs of 128 within each sequence, a scale per run."""
    out = torch.empty_like(x)
    span = sequence_rows or x.shape[0]
    for s in range(0, x.shape[0], span):
        for r in range(s, min(s + span, x.shape[0]), tile):
            stop = min(r + tile, s + span, x.shape[0])
            block = x[r:stop]
            for c in range(x.shape[1]):
                out[r:stop, c] = qdq(block[:, c], scale_of(block[:, c].abs().max(), name, margin), name)
    return out


def amax(x):
    return x.abs().max()


def main(directory):
    try:
        case = json.load(open(os.path.join(directory, "case.json")))
        t, _ = safetensors_io.read(os.path.join(directory, "inputs.safetensors"))
        loom, _ = safetensors_io.read(os.path.join(directory, "loom.safetensors"))
    except (OSError, ValueError) as e:
        print(f"bad dump: {e}")
        return 2
    recipe, margin = case["recipe"], int(case["margin"])
    grad_format = "e5m2" if case["format"] == "hybrid" else "e4m3"
    x, w, g = t["x2"], t["w2"], t["g2"]
    xq_t = gq_t = None  # the weight gradient's operands where they differ from xq and gq
    if recipe == "blockwise":
        xq, wq, gq = qdq_tiles(x, 1, "e4m3", margin), qdq_tiles(w, 128, "e4m3", margin), qdq_tiles(g, 1, grad_format, margin)
        rows = int(case.get("sequence_rows", 0))
        xq_t, gq_t = qdq_column_tiles(x, "e4m3", margin, rows), qdq_column_tiles(g, grad_format, margin, rows)
    else:
        if recipe == "delayed":  # the history holds step 1's amaxes
            sx, sw, sg = (scale_of(amax(t[k]), f, margin) for k, f in (("x1", "e4m3"), ("w1", "e4m3"), ("g1", grad_format)))
        else:
            sx, sw, sg = scale_of(amax(x), "e4m3", margin), scale_of(amax(w), "e4m3", margin), scale_of(amax(g), grad_format, margin)
        xq, wq, gq = qdq(x, sx, "e4m3"), qdq(w, sw, "e4m3"), qdq(g, sg, grad_format)
    d = torch.float64
    xq_t = xq if xq_t is None else xq_t
    gq_t = gq if gq_t is None else gq_t
    want = {"out": xq.to(d) @ wq.to(d).T + t["b"].to(d), "d_x": gq.to(d) @ wq.to(d), "d_w": gq_t.to(d).T @ xq_t.to(d),
            "d_b": g.to(d).sum(0)}
    plain = {"out": x.to(d) @ w.to(d).T + t["b"].to(d), "d_x": g.to(d) @ w.to(d), "d_w": g.to(d).T @ x.to(d)}
    ok = True
    for name, ref in want.items():
        scale = ref.abs().max().item()
        err = (loom[name].to(d) - ref).abs().max().item() / scale
        print(f"{name}: max error {err:.2e} of the largest magnitude {scale:.3e}")
        if err > 1e-5:
            ok = False
        if name in plain:
            gap = (plain[name] - ref).abs().max().item() / scale
            if gap < 1e-3:
                print(f"{name}: unquantised product only {gap:.2e} from the reference: the check cannot fail")
                ok = False
    history = loom["history"]
    pairs = (("x", "e4m3"), ("w", "e4m3"), ("g", "e4m3"))
    for i, (k, _) in enumerate(pairs):
        for j, step in enumerate(("2", "1")):
            want_amax = amax(t[k + step]).item()
            if history[i, j].item() != want_amax:
                print(f"history of {k}: entry {j} is {history[i, j].item()!r}, step {step}'s amax is {want_amax!r}")
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
