#pragma once
// Causal flash attention on the device (FlashAttention, Dao et al. 2022; backward as in
// FlashAttention-2, Dao 2023, section 3.1), the twin of loom::cpu's attention.hpp: same fused
// layouts (qkv [batch*seq, (heads + 2*kv_heads)*head_dim], out [batch*seq, heads*head_dim],
// lse [batch, heads, seq] f32), same grouped-query rule (query head h reads kv head
// h / (heads / kv_heads)). Scores, probabilities and accumulators are f32; the bf16 variant
// stores only q|k|v, out, d_out and d_qkv in bf16.
//
// Two implementations (attention_kernel() picks for bf16; f32 always takes the first):
// - scalar (attention_forward.cu, attention_backward.cu): 64 query rows x 64 keys per step,
//   head_dim <= 128 held in shared memory as f32, plain FMA loops; the reference the other is
//   tested against.
// - tensor cores (attention_mma.cu): bf16 only, head_dim 64 or 128, mma.sync m16n8k16 with f32
//   accumulators (sm_80 and later); probabilities and dS are rounded to bf16 once before their
//   products, as FlashAttention-2 does, and the softmax statistics stay f32.
// Both backward passes are deterministic: one kernel owns each (key tile, kv head) and writes its
// dK and dV, another owns each (query tile, head) and writes its dQ, so no gradient is ever
// accumulated with atomics; the price is computing the scores and dP twice.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "loom/core/cuda/stream.hpp"
#include "loom/kernels/cpu/attention.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;
// The CPU's shape struct: one description of the layout for both backends. Because it lives in
// loom::cpu, argument-dependent lookup also finds cpu::attention_forward; call these qualified
// (cuda::attention_forward) when float pointers make both viable.
using cpu::AttentionShape;

// Largest head_dim the kernels take (shared-memory tiles are sized for it).
constexpr int64_t kMaxAttentionHeadDim = 128;

// Which kernels bf16 attention runs. `pipelined` is tensor-core attention with cp.async double
// buffering and ldmatrix fragment loads (attention_pipelined.cu); `tensor_cores` the first,
// simpler tensor-core kernels (attention_mma.cu), kept as the reference the pipelined ones are
// tested against; both throw for a shape they do not take. `cudnn` is cuDNN's fused flash
// attention (attention_cudnn.hpp), where loom was built with the cudnn-frontend headers and
// libcudnn.so.9 loads; it throws, naming why, where it cannot run. `automatic` (the default)
// takes cuDNN's kernels for a bf16 causal call wherever cudnn_attention_refusal is empty (on an
// H200 on 2026-11-27 GPT-2 124M's step took 34.2 ms against the pipelined kernels' 37.7, Llama
// 1B's 70.2 against 74.3), else the pipelined kernels wherever tensor cores apply
// (tensor_cores_refusal is empty: GPT-2 124M's step on an H100 went from 46.1 to 39.8 ms
// against `tensor_cores`), else the scalar ones; `scalar` always the scalar ones. A forward and
// a backward may take different kernels (an operand's alignment): every family writes and reads
// the same lse. The environment variable LOOM_CUDA_ATTENTION (auto | scalar | tensor_cores |
// pipelined | cudnn) sets the process's starting value; any other value is an error naming it.
enum class AttentionKernel { automatic, scalar, tensor_cores, pipelined, cudnn };
void set_attention_kernel(AttentionKernel kernel);
AttentionKernel attention_kernel();
// Why the tensor-core kernels cannot take this bf16 call (empty when they can): head_dim not 64
// or 128, a pointer not 16-byte aligned, or a device before sm_80. `pointers` are every q|k|v,
// out, d_out and d_qkv pointer of the call.
std::string tensor_cores_refusal(const AttentionShape& shape,
                                 std::initializer_list<const void*> pointers);

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape,
                       cudaStream_t stream = current_stream());
void attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionShape& shape,
                       cudaStream_t stream = current_stream());

// Writes (overwrites) d_qkv in the same fused layout as qkv.
void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& shape,
                        cudaStream_t stream = current_stream());
void attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const bf16* out,
                        const float* lse, const AttentionShape& shape,
                        cudaStream_t stream = current_stream());

// ---- attention with a key range per query row (attention_ranged.cu) ------------------------
// The twin of loom::cpu's cross_attention_forward / _backward, and of its attention with key
// ranges (packed documents: q, k and v are then the columns of one fused qkv). Query row i of
// sequence b (row r = b q_len + i) sees exactly the kv rows [ranges[2r], ranges[2r + 1]) of its
// sequence, 0 <= begin <= end <= kv_len (device int32, checked by the caller); a row that sees
// none gets out 0 and lse -inf and adds nothing in backward. Query head h is at column h D of a
// q row, kv head g at column g D of a k row and of a v row, out head h at column h D; lse is
// [batch, heads, q_len] f32. Scalar kernels on the causal ones' 64 x 64 tiles; each query tile
// visits only the key tiles its rows' ranges touch, and the backward keeps one writer per
// gradient element (no atomics).
//
// Element types: q, d_out and out are TQ; k and v TKV; the forward's out (TO) and the backward's
// gradients (TG) may be wider than their inputs, so that context parallelism keeps its partial
// results and travelling gradients in f32. Instantiated for (TQ, TKV, TO/TG) = (f32, f32, f32),
// (bf16, bf16, bf16), (bf16, f32, f32) and (bf16, f32, bf16).
struct RangedAttentionShape {
  int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
};
template <typename TQ, typename TKV, typename TO>
struct RangedForwardArgs {
  TO* out;
  int64_t out_ld;
  float* lse;
  const TQ* q;
  int64_t q_ld;
  const TKV* k;
  const TKV* v;
  int64_t kv_ld;
  const int32_t* ranges;
};
template <typename TQ, typename TKV, typename TO>
void ranged_attention_forward(const RangedForwardArgs<TQ, TKV, TO>& args,
                              const RangedAttentionShape& shape,
                              cudaStream_t stream = current_stream());

// Writes (overwrites) the query heads' columns of every d_q row and the kv heads' columns of
// every d_k and d_v row.
template <typename TQ, typename TKV, typename TG>
struct RangedBackwardArgs {
  TG* d_q;
  int64_t d_q_ld;
  TG* d_k;
  TG* d_v;
  int64_t d_kv_ld;
  const TQ* d_out;
  const TQ* out;
  int64_t out_ld;
  const float* lse;
  const TQ* q;
  int64_t q_ld;
  const TKV* k;
  const TKV* v;
  int64_t kv_ld;
  const int32_t* ranges;
};
template <typename TQ, typename TKV, typename TG>
void ranged_attention_backward(const RangedBackwardArgs<TQ, TKV, TG>& args,
                               const RangedAttentionShape& shape,
                               cudaStream_t stream = current_stream());

// Ring attention's exact merge (loom::cpu::merge_attention_partials): out, lse absorb part,
// part_lse, partial softmaxes over disjoint keys. out, part [batch * seq, heads * head_dim] f32;
// lse, part_lse [batch, heads, seq] f32.
void merge_attention_partials(float* out, float* lse, const float* part, const float* part_lse,
                              int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                              cudaStream_t stream = current_stream());

}  // namespace loom::cuda
