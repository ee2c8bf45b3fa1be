#include "loom/model/attention.hpp"

namespace loom {

namespace {
FanOutSpec input_spec(const ModelConfig& c, const std::string& prefix) {
  if (c.arch == Architecture::GPT2)
    return {{{prefix + ".attn.c_attn", {c.n_embd, c.n_embd, c.n_embd}}}, c.n_embd, true, true};
  return {{{prefix + ".self_attn.q_proj", {c.q_dim()}},
           {prefix + ".self_attn.k_proj", {c.kv_dim()}},
           {prefix + ".self_attn.v_proj", {c.kv_dim()}}},
          c.n_embd,
          false,
          false};
}

FanInSpec output_spec(const ModelConfig& c, const std::string& prefix) {
  const bool gpt2 = c.arch == Architecture::GPT2;
  return {prefix + (gpt2 ? ".attn.c_proj" : ".self_attn.o_proj"), c.q_dim(), c.n_embd, gpt2, gpt2};
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const ModelConfig& c, const ParallelPlan& plan,
                                         const std::string& prefix,
                                         std::shared_ptr<const ops::Rope> rope)
    : input_projection(plan.fan_out(input_spec(c, prefix))),
      output_projection(plan.fan_in(output_spec(c, prefix))),
      dims_(plan.local_dims(c)),
      rope_(std::move(rope)) {}

ops::AttentionShape CausalSelfAttention::shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, dims_.heads, dims_.kv_heads, dims_.head_dim};
}

void CausalSelfAttention::forward(const Tensor& out, BlockStash& stash, int64_t batch,
                                  int64_t seq_len) const {
  input_projection->forward(stash.qkv, stash.norm1_out);
  // Rotate q and k heads (adjacent in the row), leave v alone.
  if (rope_) rope_->apply(stash.qkv, batch, seq_len, dims_.heads + dims_.kv_heads, false, positions());
  if (bf16_activations_) ops::round_to_bf16_(stash.qkv);
  recompute_core(stash, batch, seq_len);
  output_projection->forward(out, stash.attn_out);
}

void CausalSelfAttention::recompute_core(BlockStash& stash, int64_t batch, int64_t seq_len) const {
  if (cp_)
    cp_->forward(stash.attn_out, stash.attn_lse, stash.qkv, shape(batch, seq_len), key_ranges());
  else
    ops::attention_forward(stash.attn_out, stash.attn_lse, stash.qkv, shape(batch, seq_len),
                           key_ranges());
  if (bf16_activations_) ops::round_to_bf16_(stash.attn_out);
}

void CausalSelfAttention::backward(const Tensor& d_out, const BlockStash& stash,
                                   BlockGradScratch& scratch, int64_t batch, int64_t seq_len) {
  output_projection->backward(scratch.d_attn_out, d_out, stash.attn_out);
  if (cp_)
    cp_->backward(scratch.d_qkv, scratch.d_attn_out, stash.qkv, stash.attn_out, stash.attn_lse,
                  shape(batch, seq_len), key_ranges());
  else
    ops::attention_backward(scratch.d_qkv, scratch.d_attn_out, stash.qkv, stash.attn_out,
                            stash.attn_lse, shape(batch, seq_len), key_ranges());
  // The rotation is orthogonal: its backward rotates by the negative angle.
  if (rope_) rope_->apply(scratch.d_qkv, batch, seq_len, dims_.heads + dims_.kv_heads, true, positions());
  input_projection->backward(scratch.d_norm_out, scratch.d_qkv, stash.norm1_out);
}

void CausalSelfAttention::collect(ParameterList& out) {
  input_projection->collect(out);
  output_projection->collect(out);
}

}  // namespace loom
