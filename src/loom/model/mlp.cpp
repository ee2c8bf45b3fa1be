#include "loom/model/mlp.hpp"

#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

Mlp::Mlp(const ModelConfig& c, const std::string& prefix)
    : output_projection(c.arch == Architecture::GPT2
                            ? Linear(prefix + ".mlp.c_proj", c.ffn_hidden, c.n_embd, true, true)
                            : Linear(prefix + ".mlp.down_proj", c.ffn_hidden, c.n_embd, false, false)),
      config_(c) {
  if (c.arch == Architecture::GPT2) {
    input_projections.emplace_back(prefix + ".mlp.c_fc", c.n_embd, c.ffn_hidden, true, true);
  } else {
    input_projections.emplace_back(prefix + ".mlp.gate_proj", c.n_embd, c.ffn_hidden, false, false);
    input_projections.emplace_back(prefix + ".mlp.up_proj", c.n_embd, c.ffn_hidden, false, false);
  }
}

void Mlp::forward(float* out, BlockStash& stash, int64_t rows) const {
  const int64_t ld = stash.mlp_pre.size(1);
  int64_t column = 0;
  for (const Linear& projection : input_projections) {
    projection.forward(stash.mlp_pre.f32() + column, ld, stash.norm2_out.f32(), rows);
    column += projection.out_features();
  }
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.mlp_pre.f32(), stash.mlp_pre.numel());
  recompute_activation(stash, rows);
  output_projection.forward(out, config_.n_embd, stash.mlp_act.f32(), rows);
}

void Mlp::recompute_activation(BlockStash& stash, int64_t rows) const {
  const int64_t f = config_.ffn_hidden;
  if (config_.arch == Architecture::GPT2)
    cpu::gelu_forward(stash.mlp_act.f32(), stash.mlp_pre.f32(), rows * f);
  else
    cpu::swiglu_forward(stash.mlp_act.f32(), stash.mlp_pre.f32(), stash.mlp_pre.f32() + f, rows,
                        f, 2 * f);
  if (bf16_activations_) cpu::round_to_bf16_inplace(stash.mlp_act.f32(), rows * f);
}

void Mlp::backward(const float* d_out, const BlockStash& stash, BlockGradScratch& scratch,
                   int64_t rows) {
  const int64_t f = config_.ffn_hidden, ld = stash.mlp_pre.size(1);
  output_projection.backward(scratch.d_mlp_act.f32(), false, d_out, config_.n_embd,
                             stash.mlp_act.f32(), rows);
  if (config_.arch == Architecture::GPT2)
    cpu::gelu_backward(scratch.d_mlp_pre.f32(), scratch.d_mlp_act.f32(), stash.mlp_pre.f32(),
                       rows * f);
  else
    cpu::swiglu_backward(scratch.d_mlp_pre.f32(), scratch.d_mlp_pre.f32() + f,
                         scratch.d_mlp_act.f32(), stash.mlp_pre.f32(), stash.mlp_pre.f32() + f,
                         rows, f, 2 * f);
  int64_t column = 0;
  for (size_t i = 0; i < input_projections.size(); ++i) {
    input_projections[i].backward(scratch.d_norm_out.f32(), i > 0, scratch.d_mlp_pre.f32() + column,
                                  ld, stash.norm2_out.f32(), rows);
    column += input_projections[i].out_features();
  }
}

void Mlp::collect(ParameterList& out) {
  for (Linear& projection : input_projections) projection.collect(out);
  output_projection.collect(out);
}

}  // namespace loom
