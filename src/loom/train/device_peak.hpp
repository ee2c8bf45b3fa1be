#pragma once
// The dense datasheet peak a GPU's MFU is measured against: BF16 tensor-core FLOPS for bf16
// training (cuBLASLt runs bf16 products on tensor cores with f32 accumulation), plain FP32
// FLOPS for f32 training (loom's f32 products use CUBLAS_COMPUTE_32F, never TF32). Known for
// the GPUs of plan/hardware's presets, matched by the name the CUDA runtime reports; unknown
// GPUs (and FP32 on B200, whose datasheet we have no figure from) give nullopt, and the trainer
// then reports no MFU rather than a guess.
#include <cstdint>
#include <optional>
#include <string>

#include "loom/core/dtype.hpp"

namespace loom {

std::optional<double> dense_peak_tflops(const std::string& device_name, DType compute_dtype);

// The first visible GPU's memory (the run's devices are alike); 0 without CUDA.
int64_t first_cuda_device_memory_bytes();

// What a run's MFU is measured against and how its first line names the device: the CPU's
// SGEMM rate measured here (as bench/ does), or a GPU's datasheet dense peak for the compute
// dtype (0 when unknown: no MFU is reported); on CUDA the phrase adds the attention kernels
// and logit precision the run takes (ops::cuda_kernel_summary: auto may fall back).
struct RunDevice {
  double peak_gflops = 0;
  std::string description;
};
RunDevice describe_run_device(Device device, DType compute_dtype, int64_t head_dim);

}  // namespace loom
