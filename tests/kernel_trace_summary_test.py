#!/usr/bin/env python3
"""tools/device/kernel_trace_summary.py on a hand-made trace whose figures are worked out below.

Three steps (AdamW ends each), the first left out as warm-up (--skip 1). Times in microseconds:
  step 0: gemm 0-100, adamw 100-110                                   (step end 110)
  step 1: gemm 120-300 (launched 100-105), layer_norm 300-350,
          cross_entropy 400-450 (launched 380-395), adamw 450-470     (step end 470)
  step 2: memcpy 480-490 (called 470-478), flash attention 490-600 on stream 7 beside
          a gemm 500-650 on stream 9, adamw 660-680 (launched 600-640) (step end 680)
Window 110-680: 570 us over 2 steps. Busy runs 120-350, 400-470, 480-650, 660-680: 230 + 70 +
170 + 20 = 490 us. Gaps: 110-120 (the gemm's launch returned at 105, before the device went
idle: waited), 350-400 (the launch ran 380-395, after: host-bound), 470-480 (the copy's call
returned at 478: host-bound), 650-660 (launch returned at 640: waited): 80 us idle, 60 host-bound.
Per step: span 0.285 ms, busy 0.245, idle 0.040, host-bound 0.030; gemm 180 + 150 = 330 us ->
0.165, attention 0.055, norm 0.025, cross-entropy 0.025, optimizer 40 us -> 0.020, memcpy 0.005.
"""
import importlib.util
import json
import os
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "kernel_trace_summary", os.path.join(here, "..", "tools", "device", "kernel_trace_summary.py"))
kts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kts)

US = 1000
rows = [  # kind, start, end, stream, correlation, name
    ("kernel", 0, 100, 7, 1, "sm90_xmma_gemm_bf16bf16_bf16f32"),
    ("kernel", 100, 110, 7, 2, "loom::adamw_multi_kernel(loom::AdamWSlice const*, long, long)"),
    ("kernel", 120, 300, 7, 3, "sm90_xmma_gemm_bf16bf16_bf16f32"),
    ("kernel", 300, 350, 7, 4, "loom::layer_norm_forward_kernel(float const*)"),
    ("kernel", 400, 450, 7, 5, "loom::cross_entropy_kernel(float const*)"),
    ("kernel", 450, 470, 7, 6, "loom::adamw_multi_kernel(loom::AdamWSlice const*, long, long)"),
    ("memcpy", 480, 490, 7, 7, "memcpy kind 1 131072 bytes"),
    ("kernel", 490, 600, 7, 8, "flash_fwd_kernel"),
    ("kernel", 500, 650, 9, 9, "sm90_xmma_gemm_bf16bf16_bf16f32"),
    ("kernel", 660, 680, 7, 10, "loom::adamw_multi_kernel(loom::AdamWSlice const*, long, long)"),
    ("api", 100, 105, 0, 3, "cudaLaunchKernel"),
    ("api", 380, 395, 0, 5, "cudaLaunchKernel"),
    ("api", 470, 478, 0, 7, "cudaMemcpyAsync"),
    ("api", 600, 640, 0, 10, "cudaLaunchKernel"),
    ("api", 200, 201, 0, 99, "cudaEventRecord"),
]


def near(a, b):
    return abs(a - b) < 1e-9


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.csv")
        with open(path, "w") as f:
            f.write("kind,start_ns,end_ns,stream,correlation,name\n")
            for kind, s, e, stream, corr, name in rows:
                f.write(f'{kind},{s * US},{e * US},{stream},{corr},"{name}"\n')
        device, api = kts.read(path)
        s = kts.summarise(device, api, "(?i)adam", 1)
        failures = []

        def check(what, got, want):
            if not near(got, want):
                failures.append(f"{what}: got {got}, want {want}")

        check("steps", s["steps"], 2)
        check("span", s["span_ms"], 0.285)
        check("busy", s["busy_ms"], 0.245)
        check("idle", s["idle_ms"], 0.040)
        check("host-bound idle", s["idle_host_bound_ms"], 0.030)
        check("operations a step", s["operations_per_step"], 4.0)
        fam = s["families_ms"]
        for name, want in (("gemm", 0.165), ("attention", 0.055), ("layer/rms norm", 0.025),
                           ("cross-entropy/softmax", 0.025), ("optimizer", 0.020), ("memcpy", 0.005)):
            check(f"family {name}", fam.get(name, -1), want)
        if set(fam) != {"gemm", "attention", "layer/rms norm", "cross-entropy/softmax", "optimizer", "memcpy"}:
            failures.append(f"families: {sorted(fam)}")
        gap = s["largest_gaps"][0]
        check("largest gap", gap["us"], 50.0)
        if gap["why"] != "host-bound" or "layer_norm" not in gap["after"] or "cross_entropy" not in gap["before"]:
            failures.append(f"largest gap: {gap}")
        whys = sorted((g["us"], g["why"]) for g in s["largest_gaps"])
        if whys != [(10.0, "host-bound"), (10.0, "waited"), (10.0, "waited"), (50.0, "host-bound")]:
            failures.append(f"gaps: {whys}")
        # Through the command line: one JSON line with the same figures.
        out = os.path.join(d, "summary.jsonl")
        rc = kts.main([path, "--marker", "(?i)adam", "--skip", "1", "--label", "hand", "--json", out])
        line = json.loads(open(out).read())
        if rc != 0 or line["trace"] != "hand" or not near(line["busy_ms"], 0.245):
            failures.append(f"main: rc {rc}, {line}")
        # Too few steps for the marker: the whole trace, one step.
        whole = kts.summarise(device, api, "no such kernel", 1)
        check("no marker: span", whole["span_ms"], 0.680)
        check("no marker: busy", whole["busy_ms"], 0.100 + 0.010 + 0.230 + 0.070 + 0.170 + 0.020)
    for f in failures:
        print("FAIL", f)
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
