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
    # Real kernel names (loom's in an anonymous namespace, llm.c's, PyTorch's and cuBLAS's) in
    # their families, and their short names.
    names = [
        ("void loom::cuda::(anonymous namespace)::norm_forward_kernel<__nv_bfloat16>(Args)", "layer/rms norm",
         "loom::cuda::norm_forward_kernel"),
        ("void loom::cuda::(anonymous namespace)::norm_weight_grad_partials<float>(float const*)", "layer/rms norm", None),
        ("void loom::cuda::(anonymous namespace)::mma_forward_kernel<64, true>(Params)", "attention",
         "loom::cuda::mma_forward_kernel"),
        ("void loom::cuda::(anonymous namespace)::chunk_lse_update<__nv_bfloat16>(Args)", "cross-entropy/softmax", None),
        ("void loom::cuda::(anonymous namespace)::finalize_loss(float*)", "cross-entropy/softmax", None),
        ("void loom::cuda::(anonymous namespace)::sum_of_squares_partials(float const*)", "optimizer", None),
        ("void loom::cuda::(anonymous namespace)::adamw_multi_kernel(AdamWSlice const*, long, long)", "optimizer",
         "loom::cuda::adamw_multi_kernel"),
        ("void loom::cuda::(anonymous namespace)::quantize4_kernel<__nv_fp8_e4m3>(Args)", "fp8 cast/amax", None),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64", "gemm", None),
        ("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)", "gemm",
         "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"),
        ("void matmul_backward_bias_kernel9<float, true>(float*, __nv_bfloat16 const*, int, int, int)", "bias gradient",
         None),
        ("void layernorm_forward_kernel6(__nv_bfloat16*, float*, float*)", "layer/rms norm", None),
        ("void fused_classifier_kernel5<__nv_bfloat16>(__nv_bfloat16*, float*)", "cross-entropy/softmax", None),
        ("void global_norm_squared_kernel<__nv_bfloat16>(float*, __nv_bfloat16 const*, unsigned long)", "optimizer", None),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)>"
         "(int, float, at::detail::Array<char*, 2>)", "gelu/swiglu", "at::native::vectorized_elementwise_kernel"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int)",
         "layer/rms norm", "at::native::vectorized_layer_norm_kernel"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0",
         "attention", None),
    ]
    for name, fam, short in names:
        if kts.family("kernel", name) != fam:
            failures.append(f"family of {name}: {kts.family('kernel', name)}, want {fam}")
        if short is not None and kts.short_name(name) != short:
            failures.append(f"short name of {name}: {kts.short_name(name)}, want {short}")
    # llm.c's update: one AdamW kernel per parameter tensor (3 here), the first update with a
    # master-weight copy between them. With the marker 'adamw|copy_and_cast' each update is one run:
    # three step ends at 30, 130, 230 us; with 'adamw' alone the first update splits in three.
    llmc = []
    for step, base in enumerate((0, 100, 200)):
        llmc.append((base * US, (base + 10) * US, "kernel", "void gelu_forward_kernel2(float*)", 7, 0))
        for p in range(3):
            t = base + 10 + 6 * p
            if step == 0:
                llmc.append((t * US, (t + 3) * US, "kernel", "void copy_and_cast_kernel<float>(float*)", 7, 0))
            llmc.append(((t + 3) * US, (t + 6) * US, "kernel", "void adamw_kernel3<__nv_bfloat16>(float*)", 7, 0))
    llmc.sort()
    ends = kts.step_ends(llmc, "adamw|copy_and_cast")
    if ends != [28 * US, 128 * US, 228 * US]:
        failures.append(f"llm.c step ends: {ends}")
    if len(kts.step_ends(llmc, "adamw")) != 5:
        failures.append(f"llm.c with 'adamw' alone: {kts.step_ends(llmc, 'adamw')}")
    # The comparison table: one column per summary in the order asked, a family one lacks as 0.
    a = {"trace": "loom x", "span_ms": 2.0, "busy_ms": 1.5, "idle_ms": 0.5, "idle_host_bound_ms": 0.25,
         "families_ms": {"gemm": 1.0, "attention": 0.5}}
    b = {"trace": "llm.c y", "span_ms": 1.0, "busy_ms": 1.0, "idle_ms": 0.0, "idle_host_bound_ms": 0.0,
         "families_ms": {"gemm": 0.75, "layer/rms norm": 0.25}}
    table = kts.compare([a, b], ["llm.c y", "loom x"])
    want_rows = {"step": ["1.00", "2.00"], "gemm": ["0.75", "1.00"], "attention": ["0.00", "0.50"],
                 "layer/rms norm": ["0.25", "0.00"]}
    header = table[0].split()
    if header != ["llm.c", "loom"]:
        failures.append(f"compare header: {header}")
    seen = set()
    for line in table[1:]:
        name = line[:34].strip()
        seen.add(name)
        if name in want_rows and line[34:].split() != want_rows[name]:
            failures.append(f"compare row {name}: {line[34:].split()}")
    if not set(want_rows) <= seen:
        failures.append(f"compare rows: {sorted(seen)}")
    if len(table) != 1 + 4 + 3:
        failures.append(f"compare: {len(table)} lines")
    for f in failures:
        print("FAIL", f)
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
