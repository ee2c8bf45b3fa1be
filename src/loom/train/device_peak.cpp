#include "loom/train/device_peak.hpp"

#include <cstdio>

#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/plan/hardware.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/device_info.hpp"
#endif

namespace loom {

namespace {
bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// FP32 (non-tensor) peaks, SXM columns of the same datasheets plan/hardware cites: A100
// "FP32 19.5 TFLOPS"; H100 SXM "FP32 67 teraFLOPS"; H200 SXM "FP32 67 TFLOPS".
constexpr double kA100Fp32Tflops = 19.5;
constexpr double kH100SxmFp32Tflops = 67.0;
constexpr double kH200Fp32Tflops = 67.0;
}  // namespace

std::optional<double> dense_peak_tflops(const std::string& name, DType compute_dtype) {
  const bool bf16 = compute_dtype == DType::BF16;
  // Names as cudaGetDeviceProperties reports them, e.g. "NVIDIA H100 80GB HBM3" (SXM),
  // "NVIDIA A100-SXM4-80GB", "NVIDIA H200". The PCIe and NVL H100 boards and the H200 NVL have
  // lower clocks and other peaks, which no preset holds.
  if (contains(name, "H200") && !contains(name, "NVL")) return bf16 ? plan::gpu_preset("h200").bf16_tflops : kH200Fp32Tflops;
  if (contains(name, "H100") && !contains(name, "PCIe") && !contains(name, "NVL"))
    return bf16 ? plan::gpu_preset("h100-sxm").bf16_tflops : kH100SxmFp32Tflops;
  // A100 SXM and PCIe share their compute peaks (the datasheet lists one figure for both).
  if (contains(name, "A100"))
    return bf16 ? plan::gpu_preset("a100-80gb").bf16_tflops : kA100Fp32Tflops;
  if (contains(name, "B200") && bf16) return plan::gpu_preset("b200").bf16_tflops;
  return std::nullopt;
}

namespace {
// The first visible GPU's name and memory; empty without CUDA.
struct GpuFacts {
  std::string name;
  int64_t memory_bytes = 0;
};
GpuFacts first_cuda_device() {
#ifdef LOOM_HAVE_CUDA
  const cuda::DeviceInfo info = cuda::device_info();
  if (!info.devices.empty())
    return {info.devices.front().name, info.devices.front().total_memory_bytes};
#endif
  return {};
}
}  // namespace

int64_t first_cuda_device_memory_bytes() { return first_cuda_device().memory_bytes; }

RunDevice describe_run_device(Device device, DType compute_dtype, int64_t head_dim) {
  RunDevice run;
  char where[256];
  if (device != Device::CUDA) {
    run.peak_gflops = cpu::measure_sgemm_gflops();
    std::snprintf(where, sizeof where, "%d threads, SGEMM peak %.0f GFLOP/s", cpu::num_threads(),
                  run.peak_gflops);
    run.description = where;
    return run;
  }
  std::string name = first_cuda_device().name;
  if (name.empty()) name = "cuda";
  run.peak_gflops = dense_peak_tflops(name, compute_dtype).value_or(0.0) * 1e3;
  if (run.peak_gflops > 0)
    std::snprintf(where, sizeof where, "%s, dense peak %.0f TFLOP/s", name.c_str(),
                  run.peak_gflops / 1e3);
  else
    std::snprintf(where, sizeof where, "%s (peak unknown: no MFU)", name.c_str());
  run.description = where;
  const std::string kernels =
      ops::cuda_kernel_summary(device, head_dim, compute_dtype == DType::BF16);
  if (!kernels.empty()) run.description += ", " + kernels;
  return run;
}

}  // namespace loom
