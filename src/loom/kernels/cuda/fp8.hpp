#pragma once
// FP8 quantisation on the device, the twin of loom::cpu's fp8.hpp: the same amax, the same
// scale formula and the same round-to-nearest-even, saturating conversion (cuda_fp8.h's
// __NV_SATFINITE), so a CUDA FP8 GEMM sees exactly the codes the CPU's emulation rounds to.
// Scales live on the device ({1 / scale, scale}: the first is the dequantisation factor
// cuBLASLt's FP8 GEMMs take as their scale pointer), so quantising needs no round trip to the host.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"
#include "loom/kernels/cpu/fp8.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// *amax = max(*amax, max |x|) over a [rows, cols] block whose rows are `stride` elements apart;
// a NaN anywhere makes it NaN (cpu::abs_max's rule). *amax must start >= 0 (or NaN).
void fp8_amax(float* amax, const bf16* x, int64_t rows, int64_t cols, int64_t stride,
              cudaStream_t stream = current_stream());
void fp8_amax(float* amax, const float* x, int64_t rows, int64_t cols, int64_t stride,
              cudaStream_t stream = current_stream());

// scale_pair = {1 / s, s} with s = cpu::fp8_scale(*amax, format, margin), computed on the device.
// The inverse comes first: it is cuBLASLt's dequantisation factor, and cuBLASLt refused (an H100,
// CUDA 13.0) a scale pointer 4 bytes into an allocation, while one at its start runs.
void fp8_scale_from_amax(float* scale_pair, const float* amax, cpu::Fp8Format format, int margin,
                         cudaStream_t stream = current_stream());

// codes[r * cols + c] = the code of x[r * stride + c] * scale_pair[1] (cpu::fp8_encode of the
// f32 product), and, when codes_t is not null, the transposed copy codes_t[c * rows + r]: the
// K-contiguous operand a backward GEMM needs. When amax is not null, *amax = max(*amax, max |x|)
// as fp8_amax computes it, from the same pass (a delayed recipe's step amax without a second
// read of x).
void fp8_quantize(uint8_t* codes, uint8_t* codes_t, const bf16* x, int64_t rows, int64_t cols,
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format,
                  float* amax = nullptr, cudaStream_t stream = current_stream());
void fp8_quantize(uint8_t* codes, uint8_t* codes_t, const float* x, int64_t rows, int64_t cols,
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format,
                  float* amax = nullptr, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
