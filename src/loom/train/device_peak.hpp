#pragma once
// The dense datasheet peak a GPU's MFU is measured against: BF16 tensor-core FLOPS for bf16
// training (cuBLASLt runs bf16 products on tensor cores with f32 accumulation), plain FP32
// FLOPS for f32 training (loom's f32 products use CUBLAS_COMPUTE_32F, never TF32). Known for
// the GPUs of plan/hardware's presets, matched by the name the CUDA runtime reports; unknown
// GPUs (and FP32 on B200, whose datasheet we have no figure from) give nullopt, and the trainer
// then reports no MFU rather than a guess.
#include <optional>
#include <string>

#include "loom/core/dtype.hpp"

namespace loom {

std::optional<double> dense_peak_tflops(const std::string& device_name, DType compute_dtype);

}  // namespace loom
