#pragma once
// LayerNorm (GPT-2) and RMSNorm (Llama), forward and backward, over rows of width `dim`.
// Forward saves per-row statistics (mean and reciprocal std) so backward needs no second
// reduction over the input. Weight gradients are reduced per thread over a static split of
// the rows, then summed in thread order: deterministic for a fixed thread count.
#include <cstdint>

namespace loom::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* input,
                       const float* weight, const float* bias, int64_t rows, int64_t dim,
                       float eps);
// d_input += ...; d_weight += ...; d_bias += ...
void layernorm_backward(float* d_input, float* d_weight, float* d_bias, const float* d_out,
                        const float* input, const float* weight, const float* mean,
                        const float* rstd, int64_t rows, int64_t dim);

void rmsnorm_forward(float* out, float* rstd, const float* input, const float* weight,
                     int64_t rows, int64_t dim, float eps);
// d_input += ...; d_weight += ...
void rmsnorm_backward(float* d_input, float* d_weight, const float* d_out, const float* input,
                      const float* weight, const float* rstd, int64_t rows, int64_t dim);

}  // namespace loom::cpu
