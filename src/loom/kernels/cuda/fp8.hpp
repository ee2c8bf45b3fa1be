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

// ---- Blockwise scaling (train.fp8_recipe = "blockwise", Hopper) ----
// DeepSeek-V3's tiles with cpu::fp8_scale's scale per tile (from the tile's own amax) and
// cuBLASLt's block-scaled layouts for the dequantisation factors (1 / scale), as Transformer
// Engine's Float8BlockScaling lays them out for cuBLASLt ("GEMM-ready"): for an operand
// [rows, k] (k contiguous, the product's inner dimension)
//   1 x 128 tiles (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): tile (r, t) at t * ld + r,
//     ld = fp8_vec128_scales_ld(rows) (rows rounded up to 4);
//   128 x 128 blocks (..._BLK128x128_32F): block (i, j) at i * ld + j,
//     ld = fp8_blk128_scales_ld(k) (k / 128 rounded up to 4).
// Rows, columns and the stride are multiples of 128 here (an error otherwise). With amax not
// null, *amax = max(*amax, the largest tile amax). Padding entries are left as they are.
int64_t fp8_vec128_scales_ld(int64_t rows);
int64_t fp8_blk128_scales_ld(int64_t k);
// x [rows, cols]: codes (not null) its 1 x 128 tiles along the rows, scales[cols / 128 x ld];
// codes_t (not null) its 128 x 1 tiles down the columns, transposed: codes_t[c * rows + r], the
// operand [cols, rows] whose inner dimension is the rows, scales_t[rows / 128 x ld(cols)].
void fp8_quantize_tiles(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                        const bf16* x, int64_t rows, int64_t cols, int64_t stride,
                        cpu::Fp8Format format, int margin, float* amax = nullptr,
                        cudaStream_t stream = current_stream());
void fp8_quantize_tiles(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                        const float* x, int64_t rows, int64_t cols, int64_t stride,
                        cpu::Fp8Format format, int margin, float* amax = nullptr,
                        cudaStream_t stream = current_stream());
// x [rows, cols] in 128 x 128 blocks: codes and scales [rows / 128 x ld(cols)], and when codes_t
// is not null the transpose codes_t [cols, rows] with scales_t [cols / 128 x ld(rows)] (the same
// blocks: a weight read by the backward's input-gradient product).
void fp8_quantize_blocks(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                         const bf16* x, int64_t rows, int64_t cols, int64_t stride,
                         cpu::Fp8Format format, int margin, float* amax = nullptr,
                         cudaStream_t stream = current_stream());
void fp8_quantize_blocks(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                         const float* x, int64_t rows, int64_t cols, int64_t stride,
                         cpu::Fp8Format format, int margin, float* amax = nullptr,
                         cudaStream_t stream = current_stream());

}  // namespace loom::cuda
