#include "loom/train/device_peak.hpp"

#include "loom/plan/hardware.hpp"

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

}  // namespace loom
