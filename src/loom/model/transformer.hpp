#pragma once
// The whole language model: embeddings, blocks, final norm and the fused output projection
// with cross-entropy. Forward and backward are explicit; the model owns its activation stash
// and decides, per recomputation mode, what the stash keeps.
#include <functional>
#include <memory>
#include <vector>

#include "loom/model/block.hpp"
#include "loom/model/config.hpp"
#include "loom/model/parallel_plan.hpp"

namespace loom {

struct ForwardOptions {
  bool compute_grad = true;  // run the fused loss gradient so backward() can follow
  float grad_scale = 1.0f;   // multiplies the gradient of the summed token losses
};

class Transformer {
 public:
  // `plan` lays the layers out over tensor parallelism (null: one process). Every tp rank of
  // a model is given the same tokens and targets.
  Transformer(const ModelConfig& config, Recompute recompute = Recompute::None,
              int64_t vocab_chunk = kDefaultVocabChunk,
              std::shared_ptr<const ParallelPlan> plan = nullptr);

  // GPT-2 / nanoGPT initialisation: N(0, 0.02) weights, residual output projections scaled by
  // 1/sqrt(2 n_layer) (Radford et al. 2019, section 2.3), zero biases, unit norm weights.
  // A sharded parameter draws its whole tensor and keeps its shard, so every layout starts
  // from the weights one process would.
  void init_weights(uint64_t seed);

  // Returns the sum of per-token losses over the batch (tokens and targets are [batch, seq]).
  // With compute_grad, also accumulates the output projection's gradient and prepares the
  // gradient of the final hidden states for backward().
  double forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len,
                 const ForwardOptions& options = {});
  // Accumulates every parameter's gradient (call after forward with compute_grad).
  void backward();

  // Logits of the last position of each sequence: [batch, vocab] (no targets needed).
  std::vector<float> last_logits(const int32_t* tokens, int64_t batch, int64_t seq_len);

  void zero_grad();  // parameters whose gradient is not allocated (ZeRO-2/3) are skipped
  // Called during backward() for each parameter as soon as its gradient for this backward is
  // final (output head and final norm first, then blocks from last to first, embeddings last):
  // data parallelism starts reducing a gradient bucket while the rest of backward runs.
  using GradReadyHook = std::function<void(Parameter&)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }
  // Parameters in the order their gradients become ready in backward().
  ParameterList parameters_in_grad_ready_order();

  // Parameter units, the granularity at which ZeRO-3 gathers and frees parameters (FSDP's
  // wrapping): unit 0 is the root (embeddings, final norm, output head: used at both ends of
  // the model), unit l + 1 is block l. Hooks fire around each unit's use:
  //   forward:  before_forward(0); per block before_forward(l+1) ... after_forward(l+1);
  //             then, with compute_grad, before_backward(0) ahead of the fused head gradient,
  //             else after_forward(0);
  //   backward: per block, last to first, before_backward(l+1) ... after_backward(l+1); then
  //             after_backward(0) once the embeddings' gradients are done.
  // before_backward(u) also precedes the first write to any gradient of unit u.
  struct UnitHooks {
    std::function<void(int64_t unit)> before_forward, after_forward, before_backward, after_backward;
  };
  void set_unit_hooks(UnitHooks hooks) { unit_hooks_ = std::move(hooks); }
  int64_t unit_count() const { return config_.n_layer + 1; }
  ParameterList unit_parameters(int64_t unit);
  const ParameterList& parameters() const { return parameters_; }
  const ModelConfig& config() const { return config_; }
  const ParallelPlan& plan() const { return *plan_; }
  void set_bf16_activations(bool on);
  Recompute recompute() const { return recompute_; }
  // Output projection: the token embedding when tied, else lm_head.
  const Parameter& output_weight() const { return config_.tied_embeddings ? token_embedding : lm_head; }

  Parameter token_embedding;     // this rank's vocabulary rows under tensor parallelism
  Parameter position_embedding;  // GPT-2 only
  bool has_position_embedding() const { return config_.arch == Architecture::GPT2; }
  std::vector<std::unique_ptr<TransformerBlock>> blocks;
  std::unique_ptr<Norm> final_norm;
  Parameter lm_head;  // untied models only; the same vocabulary rows as token_embedding

 private:
  void ensure_activations(int64_t batch, int64_t seq_len);
  void check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len) const;
  void forward_hidden(const int32_t* tokens, int64_t batch, int64_t seq_len);
  EmbeddingArgs embedding_args() const;
  // Runs `run` with the gradients of `params` pointed at zeroed scratch, then sums that over
  // tp and adds it to the real gradients: under sequence parallelism these gradients are
  // partial, and the sum must cover this backward's part only, not earlier micro-batches'.
  template <typename Run>
  void with_partial_grads(const ParameterList& params, Run run);

  ModelConfig config_;
  std::shared_ptr<const ParallelPlan> plan_;
  Recompute recompute_;
  int64_t vocab_chunk_;
  std::shared_ptr<const cpu::RopeTable> rope_;
  ParameterList parameters_;
  std::vector<ParameterList> block_parameters_;
  GradReadyHook grad_ready_hook_;
  UnitHooks unit_hooks_;
  void grads_ready(const ParameterList& params);
  static void fire(const std::function<void(int64_t)>& hook, int64_t unit) {
    if (hook) hook(unit);
  }

  // Activations for the current (batch, seq_len).
  int64_t batch_ = 0, seq_len_ = 0;
  std::vector<int32_t> tokens_;
  // Rows are this rank's (ParallelPlan::local_rows).
  Tensor residuals_;        // [n_layer + 1, rows, C]: input of each block, then the last output
  Tensor final_norm_out_;   // [rows, C]
  NormStash final_norm_stash_;
  std::vector<BlockStash> stashes_;
  BlockGradScratch scratch_;
  Tensor d_hidden_;         // [rows, C] gradient of the final norm's output
  Tensor logits_chunk_;     // [rows, vocab_chunk] cross-entropy scratch
  Tensor d_residual_a_, d_residual_b_;
  bool grad_ready_ = false;
  bool bf16_activations_ = false;
};

}  // namespace loom
