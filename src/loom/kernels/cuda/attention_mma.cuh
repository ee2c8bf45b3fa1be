#pragma once
// The tensor-core attention kernels (attention_mma.cu), called by the bf16 entry points of
// attention_forward.cu and attention_backward.cu when use_tensor_cores says so.
#include <cuda_runtime.h>

#include <initializer_list>

#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_common.cuh"

namespace loom::cuda::detail {

// Under the current attention_kernel() setting: true when this bf16 call takes the tensor-core
// kernels; throws (naming why) under AttentionKernel::tensor_cores when they cannot take it.
bool use_tensor_cores(const AttentionShape& shape, std::initializer_list<const void*> pointers);
// True when the process asked for cuDNN attention (LOOM_CUDA_ATTENTION=cudnn); throws, naming
// why, when it cannot take this call.
bool use_cudnn(const AttentionShape& shape, std::initializer_list<const void*> pointers);

// Under AttentionKernel::pipelined these two run the pipelined kernels below.
void mma_attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d,
                           cudaStream_t stream);
// delta: D_i = dO_i . O_i per (batch, head, row), lse's layout (the scalar path's row_dot).
void mma_attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                            const float* delta, const AttentionDims& d, cudaStream_t stream);

// The pipelined tensor-core kernels (attention_pipelined.cu): the same arguments and results.
void pipelined_attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d,
                                 cudaStream_t stream);
void pipelined_attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                                  const float* delta, const AttentionDims& d, cudaStream_t stream);

}  // namespace loom::cuda::detail
