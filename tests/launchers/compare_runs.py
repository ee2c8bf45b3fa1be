#!/usr/bin/env python3
"""Compares a parallel `loom train` run with the one-process run of the same global batch.

The tolerances are the dist tests' (tests/dist/dist_fixture.hpp, test_tensor_parallel_training):
the first loss within 1e-6 of the reference's (relative), every loss within 1e-5 (relative),
every weight of the final model within 1e-5 (absolute). Weights come from `loom export`, which
assembles any layout's checkpoint into one Hugging Face model.safetensors.
Usage: compare_runs.py REF_METRICS PAR_METRICS REF_MODEL_DIR PAR_MODEL_DIR STEPS
Prints one line per check; exits 1 on the first failure. Plain Python: no numpy or torch.
"""
import array
import json
import struct
import sys

FIRST_LOSS_RTOL = 1e-6
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5


def train_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "step" in record and "loss" in record and "val_loss" not in record:
                losses[record["step"]] = record["loss"]
    return [losses[s] for s in sorted(losses)]


def read_safetensors(path):
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"compare_runs: {path}: {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        values = array.array("f")
        values.frombytes(data[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = values
    return tensors


def fail(message):
    print(f"compare_runs: FAIL: {message}")
    sys.exit(1)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    ref_metrics, par_metrics, ref_model, par_model, steps = sys.argv[1:]
    steps = int(steps)
    ref, par = train_losses(ref_metrics), train_losses(par_metrics)
    if len(ref) != steps or len(par) != steps:
        fail(f"expected {steps} training losses, the reference has {len(ref)}, the parallel run {len(par)}")
    if abs(par[0] - ref[0]) > FIRST_LOSS_RTOL * ref[0]:
        fail(f"first loss {par[0]!r} vs the reference's {ref[0]!r} (tolerance {FIRST_LOSS_RTOL} relative)")
    worst_loss = 0.0
    for step, (p, r) in enumerate(zip(par, ref), start=1):
        if abs(p - r) > LOSS_RTOL * r:
            fail(f"step {step}: loss {p!r} vs the reference's {r!r} (tolerance {LOSS_RTOL} relative)")
        worst_loss = max(worst_loss, abs(p - r) / r)
    print(f"compare_runs: {steps} losses follow the reference (largest relative difference {worst_loss:.2e}; "
          f"first {ref[0]:.6f}, last {ref[-1]:.6f})")

    ref_w = read_safetensors(ref_model + "/model.safetensors")
    par_w = read_safetensors(par_model + "/model.safetensors")
    if sorted(ref_w) != sorted(par_w):
        fail(f"tensor names differ: {sorted(set(ref_w) ^ set(par_w))}")
    worst_weight, values, identical = 0.0, 0, True
    for name, r in ref_w.items():
        p = par_w[name]
        if len(p) != len(r):
            fail(f"{name}: {len(p)} values vs the reference's {len(r)}")
        diff = max((abs(a - b) for a, b in zip(p, r)), default=0.0)
        if diff > WEIGHT_ATOL:
            fail(f"{name}: largest difference {diff:.3e} above {WEIGHT_ATOL}")
        worst_weight = max(worst_weight, diff)
        identical = identical and p.tobytes() == r.tobytes()
        values += len(r)
    print(f"compare_runs: {len(ref_w)} tensors ({values} weights) within {WEIGHT_ATOL} of the reference "
          f"(largest difference {worst_weight:.2e}{'; bit for bit equal' if identical else ''})")


if __name__ == "__main__":
    main()
