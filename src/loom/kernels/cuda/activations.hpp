#pragma once
// Pointwise MLP activations, device twins of loom::cpu's activations.hpp: GELU with the tanh
// approximation GPT-2 was trained with, SwiGLU = silu(gate) * up. Same layouts (gate and up
// are rows of width `dim` at leading dimension `in_ld`), same overwrite semantics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

void gelu_forward(float* out, const float* input, int64_t n,
                  cudaStream_t stream = current_stream());
void gelu_forward(bf16* out, const bf16* input, int64_t n, cudaStream_t stream = current_stream());
// d_input = d_out * gelu'(input)  (overwrites)
void gelu_backward(float* d_input, const float* d_out, const float* input, int64_t n,
                   cudaStream_t stream = current_stream());
void gelu_backward(bf16* d_input, const bf16* d_out, const bf16* input, int64_t n,
                   cudaStream_t stream = current_stream());

// out is [rows, dim]; gate and up rows at stride in_ld.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t dim,
                    int64_t in_ld, cudaStream_t stream = current_stream());
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t rows, int64_t dim,
                    int64_t in_ld, cudaStream_t stream = current_stream());
// d_gate, d_up (overwrite) share the fused layout of gate/up.
void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t rows, int64_t dim, int64_t in_ld,
                     cudaStream_t stream = current_stream());
void swiglu_backward(bf16* d_gate, bf16* d_up, const bf16* d_out, const bf16* gate, const bf16* up,
                     int64_t rows, int64_t dim, int64_t in_ld,
                     cudaStream_t stream = current_stream());

}  // namespace loom::cuda
