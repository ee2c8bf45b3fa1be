#include "loom/model/block.hpp"

#include <cstring>

#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

namespace {
NormKind norm_kind(const ModelConfig& c) {
  return c.arch == Architecture::GPT2 ? NormKind::LayerNorm : NormKind::RMSNorm;
}
std::string norm_name(const ModelConfig& c, const std::string& prefix, int which) {
  if (c.arch == Architecture::GPT2) return prefix + (which == 1 ? ".ln_1" : ".ln_2");
  return prefix + (which == 1 ? ".input_layernorm" : ".post_attention_layernorm");
}
}  // namespace

TransformerBlock::TransformerBlock(const ModelConfig& c, const ParallelPlan& plan,
                                   const std::string& prefix,
                                   std::shared_ptr<const cpu::RopeTable> rope)
    : norm1(norm_kind(c), norm_name(c, prefix, 1), c.n_embd, static_cast<float>(c.norm_eps)),
      attention(c, plan, prefix, std::move(rope)),
      norm2(norm_kind(c), norm_name(c, prefix, 2), c.n_embd, static_cast<float>(c.norm_eps)),
      mlp(c, plan, prefix),
      sequence_parallel_(plan.sequence_parallel() && plan.tp() > 1) {}

void TransformerBlock::forward(float* x_out, const float* x_in, BlockStash& stash, int64_t batch,
                               int64_t seq_len) const {
  // The residual stream and the norms hold this rank's rows (all of them without sequence
  // parallelism); attention and the MLP see every row.
  const int64_t rows = batch * seq_len, n = stash.residual_mid.numel();
  const int64_t local_rows = stash.residual_mid.size(0);
  norm1.forward(stash.norm1_out.f32(), stash.norm1, x_in, local_rows);
  round_if_bf16(stash.norm1_out.f32(), n);
  attention.forward(stash.residual_mid.f32(), stash, batch, seq_len);
  cpu::add_into(stash.residual_mid.f32(), x_in, n);
  round_if_bf16(stash.residual_mid.f32(), n);
  norm2.forward(stash.norm2_out.f32(), stash.norm2, stash.residual_mid.f32(), local_rows);
  round_if_bf16(stash.norm2_out.f32(), n);
  mlp.forward(x_out, stash, rows);
  cpu::add_into(x_out, stash.residual_mid.f32(), n);
  round_if_bf16(x_out, n);
}

void TransformerBlock::round_if_bf16(float* x, int64_t n) const {
  if (bf16_activations_) cpu::round_to_bf16_inplace(x, n);
}

void TransformerBlock::set_bf16_activations(bool on) {
  bf16_activations_ = on;
  attention.set_bf16_activations(on);
  mlp.set_bf16_activations(on);
}

void TransformerBlock::backward(float* d_x_in, const float* d_x_out, const float* x_in,
                                BlockStash& stash, BlockGradScratch& scratch, Recompute recompute,
                                int64_t batch, int64_t seq_len) {
  const int64_t rows = batch * seq_len, n = stash.residual_mid.numel();
  const int64_t local_rows = stash.residual_mid.size(0);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (recompute == Recompute::Full) {
    forward(scratch.d_norm_out.f32(), x_in, stash, batch, seq_len);  // output itself unused
  } else if (recompute == Recompute::Selective) {
    attention.recompute_core(stash, batch, seq_len);
    mlp.recompute_activation(stash, rows);
  }
  float* d_mid = scratch.d_residual_mid.f32();
  std::memcpy(d_mid, d_x_out, bytes);  // the residual passes the gradient through
  mlp.backward(d_x_out, stash, scratch, rows);
  norm2.backward(d_mid, scratch.d_norm_out.f32(), stash.residual_mid.f32(), stash.norm2,
                 local_rows);
  attention.backward(d_mid, stash, scratch, batch, seq_len);
  std::memcpy(d_x_in, d_mid, bytes);
  norm1.backward(d_x_in, scratch.d_norm_out.f32(), x_in, stash.norm1, local_rows);
}

ParameterList TransformerBlock::partial_grads() {
  ParameterList out;
  if (!sequence_parallel_) return out;
  norm1.collect(out);
  norm2.collect(out);
  for (Parameter* p : attention.partial_grads()) out.push_back(p);
  for (Parameter* p : mlp.partial_grads()) out.push_back(p);
  return out;
}

void TransformerBlock::collect(ParameterList& out) {
  norm1.collect(out);
  attention.collect(out);
  norm2.collect(out);
  mlp.collect(out);
}

}  // namespace loom
