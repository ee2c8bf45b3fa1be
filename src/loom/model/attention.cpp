#include "loom/model/attention.hpp"

#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

namespace {
FanOutSpec input_spec(const ModelConfig& c, const std::string& prefix) {
  if (c.arch == Architecture::GPT2)
    return {{{prefix + ".attn.c_attn", {c.n_embd, c.n_embd, c.n_embd}}}, c.n_embd, true, true};
  return {{{prefix + ".self_attn.q_proj", {c.n_embd}},
           {prefix + ".self_attn.k_proj", {c.kv_dim()}},
           {prefix + ".self_attn.v_proj", {c.kv_dim()}}},
          c.n_embd, false, false};
}

FanInSpec output_spec(const ModelConfig& c, const std::string& prefix) {
  const bool gpt2 = c.arch == Architecture::GPT2;
  return {prefix + (gpt2 ? ".attn.c_proj" : ".self_attn.o_proj"), c.n_embd, c.n_embd, gpt2, gpt2};
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const ModelConfig& c, const ParallelPlan& plan,
                                         const std::string& prefix,
                                         std::shared_ptr<const cpu::RopeTable> rope)
    : input_projection(plan.fan_out(input_spec(c, prefix))),
      output_projection(plan.fan_in(output_spec(c, prefix))),
      dims_(plan.local_dims(c)),
      rope_(std::move(rope)) {}

cpu::AttentionShape CausalSelfAttention::shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, dims_.heads, dims_.kv_heads, dims_.head_dim};
}

void CausalSelfAttention::forward(float* out, BlockStash& stash, int64_t batch,
                                  int64_t seq_len) const {
  const int64_t rows = batch * seq_len, ld = stash.qkv.size(1);
  input_projection->forward(stash.qkv.f32(), ld, stash.norm1_out.f32(), rows);
  if (rope_) {  // rotate q and k heads (adjacent in the row), leave v alone
    cpu::rope_apply(stash.qkv.f32(), batch, seq_len, dims_.heads + dims_.kv_heads, ld, *rope_,
                    false);
  }
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.qkv.f32(), stash.qkv.numel());
  recompute_core(stash, batch, seq_len);
  output_projection->forward(out, stash.attn_out.f32(), rows);
}

void CausalSelfAttention::recompute_core(BlockStash& stash, int64_t batch, int64_t seq_len) const {
  cpu::attention_forward(stash.attn_out.f32(), stash.attn_lse.f32(), stash.qkv.f32(),
                         shape(batch, seq_len));
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.attn_out.f32(), stash.attn_out.numel());
}

void CausalSelfAttention::backward(const float* d_out, const BlockStash& stash,
                                   BlockGradScratch& scratch, int64_t batch, int64_t seq_len) {
  const int64_t rows = batch * seq_len, ld = stash.qkv.size(1);
  output_projection->backward(scratch.d_attn_out.f32(), d_out, stash.attn_out.f32(), rows);
  cpu::attention_backward(scratch.d_qkv.f32(), scratch.d_attn_out.f32(), stash.qkv.f32(),
                          stash.attn_out.f32(), stash.attn_lse.f32(), shape(batch, seq_len));
  if (rope_) {  // the rotation is orthogonal: its backward rotates by the negative angle
    cpu::rope_apply(scratch.d_qkv.f32(), batch, seq_len, dims_.heads + dims_.kv_heads, ld, *rope_,
                    true);
  }
  input_projection->backward(scratch.d_norm_out.f32(), scratch.d_qkv.f32(), ld,
                             stash.norm1_out.f32(), rows);
}

void CausalSelfAttention::collect(ParameterList& out) {
  input_projection->collect(out);
  output_projection->collect(out);
}

}  // namespace loom
