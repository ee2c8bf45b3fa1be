#pragma once
// A mixture-of-experts feed-forward layer (Shazeer et al. 2017; Mixtral, Jiang et al. 2024;
// DeepSeek-V3, 2024): a router scores every token against E experts, each token runs through
// the top k of them (SwiGLU MLPs of ffn_hidden), and their outputs are summed with the
// router's weights. Computation is grouped: the routed copies of the tokens are gathered expert
// by expert into one contiguous buffer and each expert multiplies its rows in one GEMM, not a
// loop over tokens.
//
// Dropless by default: every token reaches its k experts, so the routed rows are exactly
// k x rows whatever the balance. With a capacity factor c > 0 each expert takes at most
// ceil(c k rows / E) rows; the slots beyond are dropped in token order (an expert keeps its
// earliest tokens, as GShard and Switch do), and a dropped slot adds nothing (the kept weights
// are not renormalised).
//
// Parameters under Mixtral's Hugging Face names, with `prefix` = "model.layers.N.block_sparse_moe":
// gate.weight [E, C] (the router), experts.i.w1 (gate) and w3 (up) [F, C], w2 (down) [C, F];
// shared experts (DeepSeekMoE) as shared_experts.w1 / w3 / w2, one MLP of S x F for every token.
// Host f32 tensors so far.
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/moe.hpp"
#include "loom/model/config.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

struct MoeSpec {
  int64_t dim = 0, experts = 0, top_k = 0, ffn_hidden = 0;
  int64_t shared_experts = 0;  // one always-on SwiGLU MLP of shared_experts x ffn_hidden
  MoeRouter router = MoeRouter::Softmax;
  double capacity_factor = 0;  // 0: dropless
  // Throws loom::Error naming the field at fault.
  void validate() const;
  // Rows one expert takes at most for `rows` tokens (rows x k when dropless).
  int64_t capacity(int64_t rows) const;
};

// What the forward keeps for the backward, and what it saw.
struct MoeStash {
  int64_t rows = 0;
  Tensor logits, probs;            // [rows, E]
  std::vector<int32_t> selected;   // [rows, k] expert ids
  Tensor weights;                  // [rows, k]
  std::vector<int64_t> counts;     // [E] routed slots per expert, before any dropping
  std::vector<int64_t> offsets;    // [E + 1] kept rows of each expert in the routed buffers
  std::vector<int32_t> position;   // [rows, k] row of slot (t, s) in the routed buffers, -1 dropped
  int64_t dropped = 0;             // slots dropped by the capacity
  Tensor routed_input;             // [kept, C] the tokens' copies, expert by expert
  Tensor pre;                      // [kept, 2F] gate | up
  Tensor act;                      // [kept, F]
  Tensor expert_out;               // [kept, C]
  Tensor shared_pre, shared_act;   // shared experts: [rows, 2 S F] gate | up, [rows, S F]
  cpu::MoeRouterLosses losses;     // the balancing (aux) and z losses of these tokens
};

class MoeLayer {
 public:
  MoeLayer(const MoeSpec& spec, const std::string& prefix);
  const MoeSpec& spec() const { return spec_; }

  // out [rows, C] = sum over each token's kept slots of weight x expert(x). x [rows, C].
  void forward(const Tensor& out, const Tensor& x, MoeStash& stash) const;
  // d_x [rows, C] (written) and every parameter's gradient (accumulated) of
  //   sum(d_out . out) + aux_scale * aux + z_scale * z.
  void backward(const Tensor& d_x, const Tensor& d_out, const Tensor& x, const MoeStash& stash, float aux_scale,
                float z_scale);
  void collect(ParameterList& out);

  // Auxiliary-loss-free balancing (DeepSeek-V3, sec. 2.1.2): the selection bias of an expert
  // that got more than the mean load falls by `rate`, one that got less rises by it. `counts`
  // are routed slots per expert (summed over the step's micro-batches). Sigmoid router only.
  void update_bias(const std::vector<int64_t>& counts, float rate);
  const std::vector<float>& bias() const { return bias_; }
  // Restores a bias saved with a checkpoint; throws loom::Error on a size mismatch.
  void set_bias(const std::vector<float>& bias);

  Parameter router;                        // [E, C]
  std::vector<Parameter> gate, up, down;   // per expert: [F, C], [F, C], [C, F]
  Parameter shared_gate, shared_up, shared_down;  // with shared experts: [S F, C], [S F, C], [C, S F]

 private:
  MoeSpec spec_;
  std::vector<float> bias_;  // [E] selection bias (sigmoid router), not a trained parameter
};

}  // namespace loom
