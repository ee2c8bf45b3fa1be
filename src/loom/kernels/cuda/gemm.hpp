#pragma once
// Matrix products through cuBLASLt, with the conventions of loom::cpu's gemm.hpp: row-major,
// weights stored [out, in] so forward is out = in @ W^T (+ bias). Compute is always fp32
// (CUBLAS_COMPUTE_32F: true f32 arithmetic, never TF32), for f32 and for bf16 inputs.
// bf16 variants: bf16 activations and weights; weight and bias gradients stay f32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"
#include "loom/kernels/cpu/fp8.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// Row-major C[m,n] = alpha * op(A) @ op(B) + beta * C with explicit leading dimensions.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaStream_t stream = current_stream());
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c, int64_t ldc,
          cudaStream_t stream = current_stream());
// bf16 operands, f32 result (weight gradients, logits).
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, float* c, int64_t ldc,
          cudaStream_t stream = current_stream());

// out[n, out_ld] columns [0, out_features) = input[n, in_features] @ weight^T + bias
// (bias may be null). The bias is added in cuBLASLt's epilogue.
void linear_forward(float* out, int64_t out_ld, const float* input, const float* weight,
                    const float* bias, int64_t n, int64_t in_features, int64_t out_features,
                    cudaStream_t stream = current_stream());
void linear_forward(bf16* out, int64_t out_ld, const bf16* input, const bf16* weight,
                    const bf16* bias, int64_t n, int64_t in_features, int64_t out_features,
                    cudaStream_t stream = current_stream());

// d_input = d_out @ W, written (accumulate_input=false) or added (true); may be null.
// d_weight += d_out^T @ input; d_bias += column sums of d_out (null to skip; needs d_weight
// or is computed by loom's own column-sum kernel). d_out has leading dimension d_out_ld.
void linear_backward(float* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const float* d_out, int64_t d_out_ld, const float* input, const float* weight,
                     int64_t n, int64_t in_features, int64_t out_features,
                     cudaStream_t stream = current_stream());
void linear_backward(bf16* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const bf16* d_out, int64_t d_out_ld, const bf16* input, const bf16* weight,
                     int64_t n, int64_t in_features, int64_t out_features,
                     cudaStream_t stream = current_stream());

// The first MLP product with GPT-2's tanh GELU in cuBLASLt's epilogue (GELU_AUX(_BIAS)):
// pre[n, ld] columns [0, out_features) = input @ weight^T + bias (bias may be null) and
// act = gelu(pre), the GELU taken of the f32 accumulator before pre is rounded to bf16. Returns
// false, having written nothing, where cuBLASLt has no such kernel (or ld is not a multiple of
// 8, or the bias epilogues are switched off, or LOOM_CUDA_GELU_EPILOGUE=0): the caller then
// runs linear_forward and the GELU kernel.
bool linear_gelu_forward(bf16* act, bf16* pre, int64_t ld, const bf16* input, const bf16* weight,
                         const bf16* bias, int64_t n, int64_t in_features, int64_t out_features,
                         cudaStream_t stream = current_stream());
// The second MLP product's input gradient carried through that GELU (DGELU epilogue):
// d_pre[n, ld] = gelu'(pre) * (d_out @ weight), weight [out_features, in_features], d_out
// [n, d_out_ld] and pre [n, ld] (in_features wide). False, having written nothing, as above.
bool gelu_input_grad(bf16* d_pre, int64_t ld, const bf16* d_out, int64_t d_out_ld,
                     const bf16* weight, const bf16* pre, int64_t n, int64_t in_features,
                     int64_t out_features, cudaStream_t stream = current_stream());

// out[r, c] += bias[c] for a [rows, cols] block whose rows are ld apart.
void add_bias(float* out, int64_t ld, const float* bias, int64_t rows, int64_t cols,
              cudaStream_t stream = current_stream());
void add_bias(bf16* out, int64_t ld, const bf16* bias, int64_t rows, int64_t cols,
              cudaStream_t stream = current_stream());

// How an FP8 operand's dequantisation factors cover it: one for the tensor, or one per tile
// in cuBLASLt's block-scaled layouts (fp8.hpp: 1 x 128 tiles along k, 128 x 128 blocks).
enum class Fp8Scaling { Tensor, Tiles1x128, Blocks128x128 };
// One FP8 operand of fp8_gemm: row-major codes [rows, k] (k contiguous) of the given format
// and the device float(s) that turn them back into values (1 / the quantisation scale).
struct Fp8Operand {
  const uint8_t* codes = nullptr;
  cpu::Fp8Format format = cpu::Fp8Format::E4M3;
  const float* inverse_scale = nullptr;
  Fp8Scaling scaling = Fp8Scaling::Tensor;
};
// c[m, n] = beta * c + (a.inverse_scale * b.inverse_scale) * A[m, k] @ B[n, k]^T on FP8 tensor
// cores (cuBLASLt; sm_89 or later; their accumulator keeps about 14 bits between cuBLASLt's
// promotions to f32, not IEEE f32 throughout), c in bf16 (ld ldc) or f32. m, n and k
// multiples of 16; two E5M2 operands are refused (cuBLASLt has no such kernel). Block-scaled
// operands (both per tile, at most one in 128 x 128 blocks; m, n, k multiples of 128) run on
// cuBLASLt's block-scaled kernels, which promote each 128-long partial sum to f32 with its scales.
void fp8_gemm(bf16* c, int64_t ldc, float beta, const Fp8Operand& a, const Fp8Operand& b, int64_t m,
              int64_t n, int64_t k, cudaStream_t stream = current_stream());
void fp8_gemm(float* c, int64_t ldc, float beta, const Fp8Operand& a, const Fp8Operand& b,
              int64_t m, int64_t n, int64_t k, cudaStream_t stream = current_stream());

// cuBLASLt's heuristic runs once per distinct product (shape, leading dimensions, types,
// epilogue, operand alignment, device); every later call of that product reuses the plan it
// chose. The counts since the process started: misses ran the heuristic, hits did not.
struct MatmulPlanStats {
  int64_t hits = 0, misses = 0, plans = 0;
};
MatmulPlanStats matmul_plan_stats();

}  // namespace loom::cuda
