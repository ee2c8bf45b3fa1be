#include "loom/model/attention.hpp"

#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

CausalSelfAttention::CausalSelfAttention(const ModelConfig& c, const std::string& prefix,
                                         std::shared_ptr<const cpu::RopeTable> rope)
    : output_projection(c.arch == Architecture::GPT2
                            ? Linear(prefix + ".attn.c_proj", c.n_embd, c.n_embd, true, true)
                            : Linear(prefix + ".self_attn.o_proj", c.n_embd, c.n_embd, false, false)),
      config_(c),
      rope_(std::move(rope)) {
  if (c.arch == Architecture::GPT2) {
    input_projections.emplace_back(prefix + ".attn.c_attn", c.n_embd, 3 * c.n_embd, true, true);
  } else {
    input_projections.emplace_back(prefix + ".self_attn.q_proj", c.n_embd, c.n_embd, false, false);
    input_projections.emplace_back(prefix + ".self_attn.k_proj", c.n_embd, c.kv_dim(), false, false);
    input_projections.emplace_back(prefix + ".self_attn.v_proj", c.n_embd, c.kv_dim(), false, false);
  }
}

cpu::AttentionShape CausalSelfAttention::shape(int64_t batch, int64_t seq_len) const {
  return {batch, seq_len, config_.n_head, config_.n_kv_head, config_.head_dim()};
}

void CausalSelfAttention::forward(float* out, BlockStash& stash, int64_t batch,
                                  int64_t seq_len) const {
  const int64_t rows = batch * seq_len, ld = stash.qkv.size(1);
  int64_t column = 0;
  for (const Linear& projection : input_projections) {
    projection.forward(stash.qkv.f32() + column, ld, stash.norm1_out.f32(), rows);
    column += projection.out_features();
  }
  if (rope_) {  // rotate q and k heads (adjacent in the row), leave v alone
    cpu::rope_apply(stash.qkv.f32(), batch, seq_len, config_.n_head + config_.n_kv_head, ld,
                    *rope_, false);
  }
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.qkv.f32(), stash.qkv.numel());
  recompute_core(stash, batch, seq_len);
  output_projection.forward(out, config_.n_embd, stash.attn_out.f32(), rows);
}

void CausalSelfAttention::recompute_core(BlockStash& stash, int64_t batch, int64_t seq_len) const {
  cpu::attention_forward(stash.attn_out.f32(), stash.attn_lse.f32(), stash.qkv.f32(),
                         shape(batch, seq_len));
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.attn_out.f32(), stash.attn_out.numel());
}

void CausalSelfAttention::backward(const float* d_out, const BlockStash& stash,
                                   BlockGradScratch& scratch, int64_t batch, int64_t seq_len) {
  const int64_t rows = batch * seq_len, ld = stash.qkv.size(1);
  output_projection.backward(scratch.d_attn_out.f32(), false, d_out, config_.n_embd,
                             stash.attn_out.f32(), rows);
  cpu::attention_backward(scratch.d_qkv.f32(), scratch.d_attn_out.f32(), stash.qkv.f32(),
                          stash.attn_out.f32(), stash.attn_lse.f32(), shape(batch, seq_len));
  if (rope_) {  // the rotation is orthogonal: its backward rotates by the negative angle
    cpu::rope_apply(scratch.d_qkv.f32(), batch, seq_len, config_.n_head + config_.n_kv_head, ld,
                    *rope_, true);
  }
  int64_t column = 0;
  for (size_t i = 0; i < input_projections.size(); ++i) {
    input_projections[i].backward(scratch.d_norm_out.f32(), i > 0, scratch.d_qkv.f32() + column,
                                  ld, stash.norm1_out.f32(), rows);
    column += input_projections[i].out_features();
  }
}

void CausalSelfAttention::collect(ParameterList& out) {
  for (Linear& projection : input_projections) projection.collect(out);
  output_projection.collect(out);
}

}  // namespace loom
