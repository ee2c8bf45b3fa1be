#pragma once
// LayerNorm (GPT-2) and RMSNorm (Llama) over rows of width `dim`, device twins of loom::cpu's
// norms.hpp: forward saves per-row mean / reciprocal std (f32), backward adds into d_input,
// d_weight and d_bias. Weight and bias gradients are f32 in both variants; their reduction over
// rows is two-stage with a fixed split, so results are deterministic.
//
// The fused variants add the residual stream and the block's output first and normalise the
// sum: residual_out = residual + delta (stored, in T: the next block's input and this norm's
// backward input), out = norm(residual_out). residual_out may alias residual.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

void layernorm_forward(float* out, float* mean, float* rstd, const float* input,
                       const float* weight, const float* bias, int64_t rows, int64_t dim, float eps,
                       cudaStream_t stream = current_stream());
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* input, const bf16* weight,
                       const bf16* bias, int64_t rows, int64_t dim, float eps,
                       cudaStream_t stream = current_stream());
// d_input += ...; d_weight += ...; d_bias += ...
void layernorm_backward(float* d_input, float* d_weight, float* d_bias, const float* d_out,
                        const float* input, const float* weight, const float* mean,
                        const float* rstd, int64_t rows, int64_t dim,
                        cudaStream_t stream = current_stream());
void layernorm_backward(bf16* d_input, float* d_weight, float* d_bias, const bf16* d_out,
                        const bf16* input, const bf16* weight, const float* mean, const float* rstd,
                        int64_t rows, int64_t dim, cudaStream_t stream = current_stream());

void rmsnorm_forward(float* out, float* rstd, const float* input, const float* weight, int64_t rows,
                     int64_t dim, float eps, cudaStream_t stream = current_stream());
void rmsnorm_forward(bf16* out, float* rstd, const bf16* input, const bf16* weight, int64_t rows,
                     int64_t dim, float eps, cudaStream_t stream = current_stream());
// d_input += ...; d_weight += ...
void rmsnorm_backward(float* d_input, float* d_weight, const float* d_out, const float* input,
                      const float* weight, const float* rstd, int64_t rows, int64_t dim,
                      cudaStream_t stream = current_stream());
void rmsnorm_backward(bf16* d_input, float* d_weight, const bf16* d_out, const bf16* input,
                      const bf16* weight, const float* rstd, int64_t rows, int64_t dim,
                      cudaStream_t stream = current_stream());

void add_layernorm_forward(float* residual_out, float* out, float* mean, float* rstd,
                           const float* residual, const float* delta, const float* weight,
                           const float* bias, int64_t rows, int64_t dim, float eps,
                           cudaStream_t stream = current_stream());
void add_layernorm_forward(bf16* residual_out, bf16* out, float* mean, float* rstd,
                           const bf16* residual, const bf16* delta, const bf16* weight,
                           const bf16* bias, int64_t rows, int64_t dim, float eps,
                           cudaStream_t stream = current_stream());
void add_rmsnorm_forward(float* residual_out, float* out, float* rstd, const float* residual,
                         const float* delta, const float* weight, int64_t rows, int64_t dim,
                         float eps, cudaStream_t stream = current_stream());
void add_rmsnorm_forward(bf16* residual_out, bf16* out, float* rstd, const bf16* residual,
                         const bf16* delta, const bf16* weight, int64_t rows, int64_t dim,
                         float eps, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
