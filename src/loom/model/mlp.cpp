#include "loom/model/mlp.hpp"

#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

namespace {
FanOutSpec input_spec(const ModelConfig& c, const std::string& prefix) {
  if (c.arch == Architecture::GPT2)
    return {{{prefix + ".mlp.c_fc", {c.ffn_hidden}}}, c.n_embd, true, true};
  return {{{prefix + ".mlp.gate_proj", {c.ffn_hidden}}, {prefix + ".mlp.up_proj", {c.ffn_hidden}}},
          c.n_embd, false, false};
}

FanInSpec output_spec(const ModelConfig& c, const std::string& prefix) {
  const bool gpt2 = c.arch == Architecture::GPT2;
  return {prefix + (gpt2 ? ".mlp.c_proj" : ".mlp.down_proj"), c.ffn_hidden, c.n_embd, gpt2, gpt2};
}
}  // namespace

Mlp::Mlp(const ModelConfig& c, const ParallelPlan& plan, const std::string& prefix)
    : input_projection(plan.fan_out(input_spec(c, prefix))),
      output_projection(plan.fan_in(output_spec(c, prefix))),
      gelu_(c.arch == Architecture::GPT2),
      ffn_local_(plan.local_dims(c).ffn_hidden) {}

void Mlp::forward(float* out, BlockStash& stash, int64_t rows) const {
  input_projection->forward(stash.mlp_pre.f32(), stash.mlp_pre.size(1), stash.norm2_out.f32(), rows);
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.mlp_pre.f32(), stash.mlp_pre.numel());
  recompute_activation(stash, rows);
  output_projection->forward(out, stash.mlp_act.f32(), rows);
}

void Mlp::recompute_activation(BlockStash& stash, int64_t rows) const {
  const int64_t f = ffn_local_;
  if (gelu_)
    cpu::gelu_forward(stash.mlp_act.f32(), stash.mlp_pre.f32(), rows * f);
  else
    cpu::swiglu_forward(stash.mlp_act.f32(), stash.mlp_pre.f32(), stash.mlp_pre.f32() + f, rows,
                        f, 2 * f);
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.mlp_act.f32(), rows * f);
}

void Mlp::backward(const float* d_out, const BlockStash& stash, BlockGradScratch& scratch,
                   int64_t rows) {
  const int64_t f = ffn_local_, ld = stash.mlp_pre.size(1);
  output_projection->backward(scratch.d_mlp_act.f32(), d_out, stash.mlp_act.f32(), rows);
  if (gelu_)
    cpu::gelu_backward(scratch.d_mlp_pre.f32(), scratch.d_mlp_act.f32(), stash.mlp_pre.f32(),
                       rows * f);
  else
    cpu::swiglu_backward(scratch.d_mlp_pre.f32(), scratch.d_mlp_pre.f32() + f,
                         scratch.d_mlp_act.f32(), stash.mlp_pre.f32(), stash.mlp_pre.f32() + f,
                         rows, f, 2 * f);
  input_projection->backward(scratch.d_norm_out.f32(), scratch.d_mlp_pre.f32(), ld,
                             stash.norm2_out.f32(), rows);
}

void Mlp::collect(ParameterList& out) {
  input_projection->collect(out);
  output_projection->collect(out);
}

}  // namespace loom
