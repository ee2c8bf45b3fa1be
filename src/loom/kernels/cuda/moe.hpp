#pragma once
// The routed rows of a mixture-of-experts layer on the device, the twins of loom::cpu's
// moe_gather / moe_gather_backward / moe_combine / moe_combine_backward (kernels/cpu/moe.hpp:
// position [rows k] is each slot's row in the routed buffers, -1 when dropped; device int32).
// Rows in T (f32 or bf16); the router's weights and their gradients in f32. Every sum runs in
// the CPU's order (slots q in order); the weights' gradients are f32 warp sums where the CPU
// sums in double.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

template <typename T>
void moe_gather(T* routed, const T* x, const int32_t* position, int64_t rows, int64_t k, int64_t c,
                cudaStream_t stream = current_stream());
template <typename T>
void moe_gather_backward(T* d_x, const T* d_routed, const int32_t* position, int64_t rows,
                         int64_t k, int64_t c, cudaStream_t stream = current_stream());
template <typename T>
void moe_combine(T* out, const T* expert_out, const float* weights, const int32_t* position,
                 int64_t rows, int64_t k, int64_t c, cudaStream_t stream = current_stream());
template <typename T>
void moe_combine_backward(T* d_expert_out, float* d_weights, const T* d_out, const T* expert_out,
                          const float* weights, const int32_t* position, int64_t rows, int64_t k,
                          int64_t c, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
