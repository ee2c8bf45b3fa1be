#pragma once
// Fused output projection + softmax + cross-entropy on the device, with the contract of
// loom::cpu::lm_head_cross_entropy: logits exist one vocabulary chunk at a time
// ([rows, vocab_chunk], f32, from cuBLASLt), reduced with an online log-sum-exp per row; with
// gradients requested a second pass recomputes each chunk's logits (skipped when one chunk
// covers the vocabulary), turns them into grad_scale * (softmax - onehot) in place and feeds
// the two products for d_hidden and d_weight. Negative targets are ignored (no loss, no
// gradient).
//
// bf16 variant: hidden, weight and d_hidden are bf16; statistics and d_weight are f32; the
// logits are bf16 (bf16_logits(), the default: the product's f32 accumulators rounded once, as
// PyTorch's autocast, Megatron-LM and llm.c keep them; statistics and softmax in f32 from them)
// and the chunk's logit gradient, rounded to bf16 for the two products (cuBLASLt wants matching
// operand types), overwrites them in place; or f32 logits with a separate bf16 gradient
// (LOOM_CUDA_LOGITS=f32: 6 bytes a logit against 2, and two more f32 passes over them). d_hidden
// is accumulated over chunks in f32 and rounded once at the end. The vocabulary-parallel
// shard passes below keep f32 logits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

template <typename T>
struct CrossEntropyArgsT {
  const T* hidden = nullptr;         // [rows, dim] input to the output projection
  const T* weight = nullptr;         // [vocab, dim] tied token embedding or lm_head
  const int32_t* targets = nullptr;  // [rows] on the device; negative = ignored
  int64_t rows = 0, dim = 0, vocab = 0;
  int64_t vocab_chunk = 0;      // logits computed per chunk of this many entries
  float grad_scale = 1.0f;      // gradient of (grad_scale * sum of row losses)
  T* d_hidden = nullptr;        // [rows, dim] overwritten, or null
  float* d_weight = nullptr;    // [vocab, dim] accumulated, or null
  float* row_losses = nullptr;  // [rows] optional per-row loss output (device)
  double* loss_sum = nullptr;   // set: the summed loss is added here (device) and the call
                                //   returns 0 without waiting for the stream
  void* workspace = nullptr;    // cross_entropy_workspace_bytes(...) bytes, or null to
  size_t workspace_bytes = 0;   //   allocate (stream-ordered) per call
};
using CrossEntropyArgs = CrossEntropyArgsT<float>;
using CrossEntropyArgsBf16 = CrossEntropyArgsT<bf16>;

// Whether the bf16 variant keeps its logits in bf16: LOOM_CUDA_LOGITS = bf16 (the default) or
// f32, read once (any other value is an error naming it); set_bf16_logits overrides it (tests).
bool bf16_logits();
void set_bf16_logits(bool on);

// Device scratch one call needs (logit chunk, per-row statistics, and for bf16 the f32
// d_hidden accumulator and, with f32 logits, the rounded logit gradient).
size_t cross_entropy_workspace_bytes(int64_t rows, int64_t dim, int64_t vocab, int64_t vocab_chunk,
                                     bool bf16_variant);

// Returns the sum of the losses of all rows with a target, added in double in a fixed order.
// Waits for `stream` (the loss comes back to the host), unless args.loss_sum takes the sum.
double lm_head_cross_entropy(const CrossEntropyArgs& args, cudaStream_t stream = current_stream());
double lm_head_cross_entropy(const CrossEntropyArgsBf16& args,
                             cudaStream_t stream = current_stream());

// The two passes over a vocabulary shard (tensor parallelism: the reductions over the ranks sit
// between them). weight holds ids [vocab_begin, vocab_begin + shard); targets are device ids
// of the full vocabulary; logits is [rows, chunk] f32 scratch that keeps a single chunk's
// logits from pass 1 for pass 2.
template <typename T>
struct ShardLogitsT {
  const T* hidden = nullptr;
  const T* weight = nullptr;
  const int32_t* targets = nullptr;
  int64_t rows = 0, dim = 0, shard = 0, vocab_begin = 0, chunk = 0;
  float* logits = nullptr;
};
// Device arrays [rows]: max logit, sum of exp(logit - max), the target's logit (0 when the
// shard does not own it).
void shard_logit_stats(const ShardLogitsT<float>& args, float* row_max, float* row_sum,
                       float* target_logit, cudaStream_t stream = current_stream());
void shard_logit_stats(const ShardLogitsT<bf16>& args, float* row_max, float* row_sum,
                       float* target_logit, cudaStream_t stream = current_stream());
// From device lse [rows]: d_hidden overwritten (null to skip), d_weight accumulated (null to
// skip). bf16: the logit gradient is rounded to bf16 for the products and d_hidden accumulated
// in f32 over the chunks, as in lm_head_cross_entropy.
void shard_logit_grad(const ShardLogitsT<float>& args, const float* lse, float grad_scale,
                      float* d_hidden, float* d_weight, cudaStream_t stream = current_stream());
void shard_logit_grad(const ShardLogitsT<bf16>& args, const float* lse, float grad_scale,
                      bf16* d_hidden, float* d_weight, cudaStream_t stream = current_stream());

// Between the two passes, after the row maxima are reduced over the shards: each row's sum of
// exp(logit - local_max) to the global max, row_sum *= exp(local_max - global_max).
void rescale_row_sums(float* row_sum, const float* local_max, const float* global_max, int64_t rows,
                      cudaStream_t stream = current_stream());
// lse[r] = row_max[r] + log(row_sum[r]); each row's loss lse - target_logit (0 for a negative
// target) into row_losses (null to skip); their sum in double in a fixed order (one block) into
// *loss, or added to it with `accumulate`. Nothing waits.
void log_sum_exp_loss(double* loss, bool accumulate, float* lse, float* row_losses,
                      const float* row_max, const float* row_sum, const float* target_logit,
                      const int32_t* targets, int64_t rows, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
