#pragma once
// Causal self-attention: projections to q|k|v (GPT-2: one fused c_attn with bias; Llama:
// separate q/k/v projections without bias writing side by side), RoPE for Llama, the
// flash-style attention kernel, and the output projection. The projections come from the
// model's ParallelPlan, so under tensor parallelism this rank computes its own heads.
#include <cstdint>
#include <memory>
#include <span>

#include "loom/kernels/ops.hpp"
#include "loom/model/config.hpp"
#include "loom/model/context_parallel.hpp"
#include "loom/model/parallel_plan.hpp"
#include "loom/model/stash.hpp"

namespace loom {

// How the tokens of the micro-batch being run sit in their documents, as every block's
// attention reads it: each query row's key range (packed documents: the row's document up to
// itself) and each token's position (RoPE's angle), or empty for plain causal attention over
// positions 0..T-1. The Transformer owns one, shared by its blocks, and points it at the
// micro-batch's own before running a chunk's forward or backward.
struct SequenceLayout {
  std::span<const int32_t> key_ranges;
  std::span<const int32_t> positions;
  std::span<const int32_t> window_key_ranges;  // the sliding-window layers' (model.sliding_window)
};

class CausalSelfAttention {
 public:
  CausalSelfAttention(const ModelConfig& config, const ParallelPlan& plan,
                      const std::string& prefix, std::shared_ptr<const ops::Rope> rope);
  // Reads stash.norm1_out, writes stash.qkv, attn_out, attn_lse, and out = attn_out @ Wo^T.
  void forward(const Tensor& out, BlockStash& stash, int64_t batch, int64_t seq_len) const;
  // Recomputes attn_out / attn_lse from the saved qkv (selective recomputation).
  void recompute_core(BlockStash& stash, int64_t batch, int64_t seq_len) const;
  // From d_out (gradient of the block's attention output) to scratch.d_norm_out (written).
  void backward(const Tensor& d_out, const BlockStash& stash, BlockGradScratch& scratch,
                int64_t batch, int64_t seq_len);
  void collect(ParameterList& out);
  ParameterList partial_grads() { return output_projection->partial_grads(); }
  void set_bf16_activations(bool on) { bf16_activations_ = on; }
  void set_layout(std::shared_ptr<const SequenceLayout> layout) { layout_ = std::move(layout); }
  // A sliding-window layer reads the layout's window ranges instead of its causal ones.
  void set_windowed(bool windowed) { windowed_ = windowed; }
  // Context parallelism: this rank's rows are its chunks of each sequence, and the attention
  // core reaches the other ranks' keys through `cp` (null: the whole sequence is here).
  void set_context_parallel(std::shared_ptr<ContextAttention> cp) { cp_ = std::move(cp); }

  std::unique_ptr<FanOutProjection> input_projection;  // GPT-2: c_attn; Llama: q, k, v
  std::unique_ptr<FanInProjection> output_projection;

 private:
  ops::AttentionShape shape(int64_t batch, int64_t seq_len) const;
  LocalDims dims_;
  bool bf16_activations_ = false;  // round stored activations to bf16 values
  bool windowed_ = false;
  std::shared_ptr<const ops::Rope> rope_;
  std::shared_ptr<const SequenceLayout> layout_;  // null or empty ranges: causal
  std::shared_ptr<ContextAttention> cp_;
  std::span<const int32_t> key_ranges() const {
    if (!layout_) return {};
    return windowed_ ? layout_->window_key_ranges : layout_->key_ranges;
  }
  std::span<const int32_t> positions() const {
    return layout_ ? layout_->positions : std::span<const int32_t>();
  }
};

}  // namespace loom
