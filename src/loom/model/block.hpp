#pragma once
// A pre-norm transformer block: x + attn(norm1(x)), then + mlp(norm2(.)), where the MLP may
// be a mixture of experts.
#include "loom/model/attention.hpp"
#include "loom/model/mlp.hpp"
#include "loom/model/moe.hpp"
#include "loom/model/norm.hpp"

namespace loom {

class TransformerBlock {
 public:
  // Layer `layer` of the model: a mixture of experts when config.is_moe_layer(layer).
  TransformerBlock(const ModelConfig& config, const ParallelPlan& plan, const std::string& prefix,
                   std::shared_ptr<const ops::Rope> rope, int64_t layer);
  // x_in, x_out: [local_rows, C], this rank's rows of the residual stream.
  void forward(const Tensor& x_out, const Tensor& x_in, BlockStash& stash, int64_t batch,
               int64_t seq_len) const;
  // d_x: on entry the gradient of the block's output, on return that of its input (in place:
  // the residual passes the gradient through, and what the norms' backwards add goes straight
  // into it). `recompute` says what the stash is missing: Selective reruns the attention core
  // and the MLP activation, Full reruns the whole forward.
  void backward(const Tensor& d_x, const Tensor& x_in, BlockStash& stash, BlockGradScratch& scratch,
                Recompute recompute, int64_t batch, int64_t seq_len);
  void collect(ParameterList& out);
  // Where each collected parameter sits in the whole block's order, and how many the whole
  // block has: they differ under expert parallelism, where a rank holds some experts only.
  // The initialisation streams follow the whole block's order, so every ep draws the same.
  std::vector<int64_t> parameter_slots();
  int64_t whole_parameter_count();
  // Under sequence parallelism, the parameters applied to this rank's rows only (norms,
  // row-parallel biases), whose gradients the model sums over tp; else none.
  ParameterList partial_grads();
  // Mixed precision on the CPU: round every activation the block stores or passes on to a
  // bf16 value (the numerics of bf16 activations; the arithmetic itself stays f32).
  void set_bf16_activations(bool on);

  Norm norm1;
  CausalSelfAttention attention;
  Norm norm2;
  // The feed-forward: a dense MLP, or a mixture of experts (model.n_experts > 0).
  std::unique_ptr<Mlp> mlp;
  std::unique_ptr<MoeLayer> moe;

 private:
  void round_if_bf16(const Tensor& x) const;
  bool bf16_activations_ = false;
  bool sequence_parallel_;
  float aux_loss_coef_ = 0.0f, z_loss_coef_ = 0.0f;  // MoE blocks
};

}  // namespace loom
