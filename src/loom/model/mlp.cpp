#include "loom/model/mlp.hpp"

#include "loom/kernels/ops.hpp"

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
      gelu_(c.arch == Architecture::GPT2) {}

void Mlp::forward(const Tensor& out, BlockStash& stash) const {
  // GPT-2's GELU in the first product's epilogue where the device has one (CUDA, bf16): the
  // GELU of the f32 product, one rounding fewer than the two-kernel path below. (Selective
  // recomputation rebuilds mlp_act from the rounded pre with the GELU kernel: up to one bf16
  // ulp from this, inside the bf16 tolerances.)
  if (!gelu_ || !input_projection->forward_gelu(stash.mlp_act, stash.mlp_pre, stash.norm2_out)) {
    input_projection->forward(stash.mlp_pre, stash.norm2_out);
    if (bf16_activations_) ops::round_to_bf16_(stash.mlp_pre);
    recompute_activation(stash);
  }
  output_projection->forward(out, stash.mlp_act);
}

void Mlp::recompute_activation(BlockStash& stash) const {
  if (gelu_)
    ops::gelu_forward(stash.mlp_act, stash.mlp_pre);
  else
    ops::swiglu_forward(stash.mlp_act, stash.mlp_pre);
  if (bf16_activations_) ops::round_to_bf16_(stash.mlp_act);
}

void Mlp::backward(const Tensor& d_out, const BlockStash& stash, BlockGradScratch& scratch) {
  if (gelu_ && output_projection->backward_through_gelu(scratch.d_mlp_pre, d_out, stash.mlp_act,
                                                        stash.mlp_pre)) {
    // d_pre straight from the second product's epilogue (DGELU), as in the forward.
  } else {
    output_projection->backward(scratch.d_mlp_act, d_out, stash.mlp_act);
    if (gelu_)
      ops::gelu_backward(scratch.d_mlp_pre, scratch.d_mlp_act, stash.mlp_pre);
    else
      ops::swiglu_backward(scratch.d_mlp_pre, scratch.d_mlp_act, stash.mlp_pre);
  }
  input_projection->backward(scratch.d_norm_out, scratch.d_mlp_pre, stash.norm2_out);
}

void Mlp::collect(ParameterList& out) {
  input_projection->collect(out);
  output_projection->collect(out);
}

}  // namespace loom
