#pragma once
// The attention kernels under emulation, each file's kernels in its own translation unit (their
// internals share names in each file's unnamed namespace).
#include "emulated_cuda.hpp"
//
#include "loom/kernels/cuda/attention_common.cuh"

namespace emulated {

using bf16 = __nv_bfloat16;
using loom::cuda::detail::AttentionDims;

// attention_mma.cu's kernels (the ones that ran on the H100).
void mma_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d);
void mma_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                  const float* delta, const AttentionDims& d);
// attention_pipelined.cu's kernels.
void pipelined_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d);
void pipelined_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                        const float* delta, const AttentionDims& d);

}  // namespace emulated
