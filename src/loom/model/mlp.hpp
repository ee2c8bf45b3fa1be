#pragma once
// Feed-forward block: GELU MLP (GPT-2: c_fc -> gelu -> c_proj, with biases) or SwiGLU
// (Llama: down(silu(gate(x)) * up(x)), no biases; gate and up write side by side).
#include "loom/model/config.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/stash.hpp"

namespace loom {

class Mlp {
 public:
  Mlp(const ModelConfig& config, const std::string& prefix);
  // Reads stash.norm2_out; writes stash.mlp_pre, stash.mlp_act and out.
  void forward(float* out, BlockStash& stash, int64_t rows) const;
  void recompute_activation(BlockStash& stash, int64_t rows) const;
  // From d_out to scratch.d_norm_out (written).
  void backward(const float* d_out, const BlockStash& stash, BlockGradScratch& scratch,
                int64_t rows);
  void collect(ParameterList& out);
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

  std::vector<Linear> input_projections;  // GPT-2: {c_fc}; Llama: {gate, up}
  Linear output_projection;

 private:
  ModelConfig config_;
  bool bf16_activations_ = false;  // round stored activations to bf16 values
};

}  // namespace loom
