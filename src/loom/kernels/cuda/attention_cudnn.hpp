#pragma once
// Causal attention through cuDNN's fused flash attention (cuDNN 9's scaled-dot-product-attention
// graphs, built with NVIDIA's header-only cudnn-frontend), on loom's fused layouts as they lie:
// q, k and v are strided views of the qkv rows, out and the lse are written where the
// kernels of attention.hpp write them, and d_q, d_k and d_v land in the d_qkv rows. Taken for
// bf16 when LOOM_CUDA_ATTENTION=cudnn (attention.hpp), so that it can be tested against the
// CPU and measured beside loom's own tensor-core kernels before `auto` chooses it.
//
// The graphs live in libloom_cudnn.so (cudnn/attention_cudnn_plugin.cpp), built only where the
// cudnn-frontend headers are found at configure time (LOOM_CUDNN_FRONTEND_INCLUDE, default
// .device/cudnn-frontend/include: tools/device/cudnn_frontend.sh puts them there) and opened
// the first time cuDNN attention is asked for (attention_cudnn.cu), so loom's binaries start
// where cuDNN is missing and say so only when asked for it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "loom/kernels/cpu/attention.hpp"

namespace loom::cuda::detail {

// Why cuDNN attention cannot run here (empty when it can): loom built without the plugin, the
// plugin or libcudnn.so.9 not loading, a device before sm_80, or a shape or pointer it does not
// take (head_dim not a multiple of 8 or above 128, a sequence of 1, a pointer not 16-byte
// aligned).
std::string cudnn_attention_refusal(const cpu::AttentionShape& shape,
                                    std::initializer_list<const void*> pointers);

// out [batch * seq, heads * head_dim] bf16, lse [batch, heads, seq] f32 (natural log of the
// softmax denominator of scale * q.k, as the other kernels write it), qkv the fused rows.
void cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                             const cpu::AttentionShape& shape, cudaStream_t stream);

// Writes (overwrites) d_qkv in the layout of qkv, from the lse the forward wrote.
// Deterministic (cuDNN's deterministic backward, as loom's own kernels are) unless
// LOOM_CUDA_CUDNN_DETERMINISTIC=0.
void cudnn_attention_backward(__nv_bfloat16* d_qkv, const __nv_bfloat16* d_out,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const cpu::AttentionShape& shape, cudaStream_t stream);

}  // namespace loom::cuda::detail
