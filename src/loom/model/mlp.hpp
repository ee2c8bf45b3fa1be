#pragma once
// Feed-forward block: GELU MLP (GPT-2: c_fc -> gelu -> c_proj, with biases) or SwiGLU
// (Llama: down(silu(gate(x)) * up(x)), no biases; gate and up write side by side). The
// projections come from the model's ParallelPlan: under tensor parallelism this rank computes
// its own columns of the hidden layer.
#include <memory>

#include "loom/model/config.hpp"
#include "loom/model/parallel_plan.hpp"
#include "loom/model/stash.hpp"

namespace loom {

class Mlp {
 public:
  Mlp(const ModelConfig& config, const ParallelPlan& plan, const std::string& prefix);
  // Reads stash.norm2_out; writes stash.mlp_pre, stash.mlp_act and out.
  void forward(const Tensor& out, BlockStash& stash) const;
  void recompute_activation(BlockStash& stash) const;
  // From d_out to scratch.d_norm_out (written).
  void backward(const Tensor& d_out, const BlockStash& stash, BlockGradScratch& scratch);
  void collect(ParameterList& out);
  ParameterList partial_grads() { return output_projection->partial_grads(); }
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

  std::unique_ptr<FanOutProjection> input_projection;  // GPT-2: c_fc; Llama: gate, up
  std::unique_ptr<FanInProjection> output_projection;

 private:
  bool gelu_;
  bool bf16_activations_ = false;  // round stored activations to bf16 values
};

}  // namespace loom
