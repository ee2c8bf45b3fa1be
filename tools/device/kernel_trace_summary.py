#!/usr/bin/env python3
"""Where a training step's device time goes, from a kernel_trace CSV (tools/device/kernel_trace).

    kernel_trace_summary.py TRACE.csv --marker REGEX [--skip N] [--label NAME] [--json OUT]

Steps are cut at the optimizer: a step ends where a run of consecutive device operations whose
names match --marker (the AdamW kernels: loom's adamw_multi_kernel, llm.c's adamw_kernel3,
PyTorch's fused AdamW) ends. The first --skip steps (warm-up, compilation) are left out; the
rest are averaged. Per step: the span (one step end to the next), the busy time (the union of
every kernel, copy and set on every stream), the idle time, and of the idle time the part where
the host had not yet returned from launching the next operation when the device went idle
(host-bound: launch overhead or host work between launches) against the rest (the operation was
queued and waited on a dependency: an event, a copy, another stream). Then the time per kernel
family (kernel durations summed, so work overlapping on two streams counts twice), the top
kernels and the largest gaps with their neighbours. Stdlib only (the device image's python).
"""
import argparse
import bisect
import collections
import csv
import json
import re
import sys

# Kernel families, first match wins: attention before GEMM (flash kernels are GEMMs too), GEMM
# before the FP8 casts (cuBLASLt's FP8 GEMMs name e4m3), llm.c's bias-gradient reduction before
# GEMM. Names as loom (kernels/cuda), llm.c (train_gpt2.cu) and PyTorch / Inductor give them.
FAMILIES = [
    ("attention", r"flash|fmha|sdpa|attention|attn|scaled_dot|cudnn_generated|\bmma_(forward|backward)"
                  r"|pipelined_(forward|backward)|ranged_(forward|backward)"),
    ("bias gradient", r"matmul_backward_bias|bias_grad"),
    ("gemm", r"gemm|cutlass|cublas|nvjet|xmma|matmul|sm90_|sm80_|sm100_|ampere_|hopper_|wgmma|splitk"),
    ("fp8 cast/amax", r"fp8|e4m3|e5m2|amax|quantis|quantiz"),
    ("layer/rms norm", r"layer_?norm|layernorm|rms_?norm|rmsnorm|add_norm|\bnorm_(forward|backward|weight)"
                       r"|norm_fwd|norm_bwd"),
    ("cross-entropy/softmax", r"cross_?entropy|softmax|logsumexp|xent|nll|crossentropy|\blse|_lse_|finalize_loss"
                              r"|fused_classifier|token_grad"),
    ("optimizer", r"adam|multi_tensor|optimizer|grad_norm|global_norm|clip|l2norm|norm_squared|sums?_of_squares"),
    ("gelu/swiglu", r"gelu|silu|swiglu|swish"),
    ("embedding/encoder", r"embed|encoder|wte|wpe|gather|index_select|scatter|shard_lookup|position"),
]
COMPILED = [(fam, re.compile(pattern)) for fam, pattern in FAMILIES]


def plain_name(name):
    """A kernel's name without its return type, "(anonymous namespace)::" and its arguments; the
    template arguments stay (PyTorch's elementwise kernels name their op there)."""
    return re.sub(r"\(.*", "", re.sub(r"^void ", "", name.replace("(anonymous namespace)::", "")))


def short_name(name):
    """plain_name without template arguments, but for CUTLASS's (whose template names the tile)."""
    name = plain_name(name)
    return (name if name.startswith("cutlass") else re.sub(r"<.*", "", name))[:100]


def family(kind, name):
    if kind == "memcpy":
        return "memcpy"
    if kind == "memset":
        return "memset"
    low = plain_name(name).lower()
    for fam, pattern in COMPILED:
        if pattern.search(low):
            return fam
    return "elementwise/other"


def read(path):
    device, api = [], {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start, end = int(row["start_ns"]), int(row["end_ns"])
            if row["kind"] == "api":
                # A runtime call and the driver call inside it may share a correlation id: the
                # later end is the launch's.
                corr = int(row["correlation"])
                if corr not in api or end > api[corr][1]:
                    api[corr] = (start, end, row["name"])
            elif end > start:
                device.append((start, end, row["kind"], row["name"], int(row["stream"]), int(row["correlation"])))
    device.sort()
    return device, api


def step_ends(device, marker):
    """The end of each run of consecutive marker operations, in time order."""
    pattern = re.compile(marker)
    ends, run_end = [], None
    for start, end, kind, name, _, _ in device:
        if pattern.search(name):
            run_end = end if run_end is None else max(run_end, end)
        elif run_end is not None:
            ends.append(run_end)
            run_end = None
    if run_end is not None:
        ends.append(run_end)
    return ends


def union(intervals):
    """Sorted, merged intervals."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def summarise(device, api, marker, skip):
    ends = step_ends(device, marker)
    # Step 0 has no marker before it, so it is always out; step k runs from ends[k-1] to ends[k].
    first = max(skip, 1) - 1
    if len(ends) >= first + 2:
        t0, t1, steps = ends[first], ends[-1], len(ends) - 1 - first
    elif device:  # no marker (or too few): the whole trace as one step
        print(f"        (only {len(ends)} step ends matched the marker: the whole trace is taken as one step)")
        t0, t1, steps = device[0][0], max(d[1] for d in device), 1
    else:
        return None
    inside = [d for d in device if d[1] > t0 and d[0] < t1]
    clipped = [(max(s, t0), min(e, t1)) for s, e, *_ in inside]
    busy_runs = union(clipped)
    busy = sum(e - s for s, e in busy_runs)
    span = t1 - t0
    starts = [d[0] for d in inside]
    by_end = sorted((d[1], i) for i, d in enumerate(inside))
    end_times = [e for e, _ in by_end]
    gaps, host_bound = [], 0
    edges = [t0] + [x for run in busy_runs for x in run] + [t1]
    for g0, g1 in zip(edges[0::2], edges[1::2]):
        if g1 <= g0:
            continue
        # The operation that ends the gap: the first to start at or after g1.
        i = bisect.bisect_left(starts, g1)
        nxt = inside[i] if i < len(inside) else None
        launch = api.get(nxt[5]) if nxt else None
        # A blocking copy or set returns once done: its start says when the host issued it.
        blocking = launch is not None and ("Memcpy" in launch[2] or "Memset" in launch[2]) and "Async" not in launch[2]
        late = launch is not None and (launch[0] if blocking else launch[1]) >= g0
        if late:
            host_bound += g1 - g0
        j = bisect.bisect_right(end_times, g0)  # the last operation to end by g0
        prev = inside[by_end[j - 1][1]] if j > 0 else None
        gaps.append((g1 - g0, g0, prev[3] if prev else "(window start)", nxt[3] if nxt else "(window end)",
                     "host-bound" if late else ("waited" if launch else "no launch record")))
    per_family, per_kernel, count = collections.Counter(), collections.Counter(), collections.Counter()
    for s, e, kind, name, _, _ in inside:
        d = min(e, t1) - max(s, t0)
        per_family[family(kind, name)] += d
        short = short_name(name)
        per_kernel[short] += d
        count[short] += 1
    ms = lambda ns: ns / 1e6 / steps
    gaps.sort(reverse=True)
    return {
        "steps": steps,
        "span_ms": ms(span),
        "busy_ms": ms(busy),
        "idle_ms": ms(span - busy),
        "idle_host_bound_ms": ms(host_bound),
        "operations_per_step": len(inside) / steps,
        "families_ms": {k: ms(v) for k, v in per_family.most_common()},
        "top_kernels": [{"name": k, "ms": ms(v), "per_step": count[k] / steps} for k, v in per_kernel.most_common(15)],
        "largest_gaps": [{"us": g / 1e3, "after": a[:80], "before": b[:80], "why": w} for g, _, a, b, w in gaps[:10]],
    }


def compare(summaries, labels=None):
    """Lines of a table: ms a step per kernel family (and busy, idle, span), one column per
    summary (the JSON lines main --json writes), in the given order."""
    rows = [r for r in summaries if labels is None or r["trace"] in labels]
    if labels is not None:
        rows.sort(key=lambda r: labels.index(r["trace"]))
    if not rows:
        return []
    families = []
    for r in rows:
        for fam in r["families_ms"]:
            if fam not in families:
                families.append(fam)
    width = max(12, *(len(r["trace"].split(" ")[0]) for r in rows))
    lines = ["          " + " " * 24 + "".join(f"{r['trace'].split(' ')[0]:>{width}}" for r in rows)]
    for key, name in (("span_ms", "step"), ("busy_ms", "busy"), ("idle_ms", "idle"),
                      ("idle_host_bound_ms", "idle, host-bound")):
        lines.append(f"          {name:24s}" + "".join(f"{r[key]:>{width}.2f}" for r in rows))
    for fam in families:
        lines.append(f"          {fam:24s}" + "".join(f"{r['families_ms'].get(fam, 0.0):>{width}.2f}" for r in rows))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a trace CSV, or with --compare the JSON lines file --json wrote")
    ap.add_argument("--compare", nargs="*", metavar="LABEL",
                    help="print a table of the summaries in TRACE (a --json file) with these labels, in order")
    ap.add_argument("--marker", help="regex naming the optimizer kernels that end a step")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out, the first always (default 3)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append the summary as one JSON line to this file")
    args = ap.parse_args(argv)
    if args.compare is not None:
        summaries = [json.loads(line) for line in open(args.trace) if line.strip()]
        lines = compare(summaries, args.compare or None)
        print("        trace comparison, ms a step:" if lines else "        trace comparison: no summaries")
        print("\n".join(lines))
        return 0
    if not args.marker:
        ap.error("--marker is required to summarise a trace")
    device, api = read(args.trace)
    s = summarise(device, api, args.marker, args.skip)
    label = args.label or args.trace
    if s is None:
        print(f"        trace {label}: no device operations in {args.trace}")
        return 1
    print(f"        trace {label}: {s['steps']} steps: {s['span_ms']:.2f} ms a step, busy {s['busy_ms']:.2f}, idle "
          f"{s['idle_ms']:.2f} (host-bound {s['idle_host_bound_ms']:.2f}), {s['operations_per_step']:.0f} operations a step")
    print("          per family (ms a step): " +
          ", ".join(f"{k} {v:.2f}" for k, v in s["families_ms"].items()))
    for k in s["top_kernels"][:10]:
        print(f"          {k['ms']:7.3f} ms {k['per_step']:6.1f}x  {k['name'][:90]}")
    for g in s["largest_gaps"][:5]:
        print(f"          gap {g['us']:8.1f} us ({g['why']}) after {g['after'][:40]} before {g['before'][:40]}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"trace": label, **s}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
