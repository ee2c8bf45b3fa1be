#pragma once
// The whole language model: embeddings, blocks, final norm and the fused output projection
// with cross-entropy. Forward and backward are explicit; the model decides, per recomputation
// mode, what an activation set keeps. The whole model keeps its own set; a chunk's forward and
// backward run on a set the caller holds, so whoever runs several micro-batches at once
// (parallel/pipeline_activations) keeps their sets.
#include <functional>
#include <memory>
#include <vector>

#include "loom/kernels/weight_grads.hpp"
#include "loom/model/block.hpp"
#include "loom/model/config.hpp"
#include "loom/model/context_parallel.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/model/loss_sum.hpp"
#include "loom/model/parallel_plan.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/model/stash.hpp"

namespace loom {

struct ForwardOptions {
  bool compute_grad = true;  // run the fused loss gradient so backward() can follow
  float grad_scale = 1.0f;   // multiplies the gradient of the summed token losses
  // Set (on the model's device): the summed loss is added there and the forward returns 0,
  // without waiting for the device (model/loss_sum).
  LossSum* loss_sum = nullptr;
};

class Transformer {
 public:
  // `plan` lays the layers out over tensor parallelism (null: one process). Every tp rank of
  // a model is given the same tokens and targets. `chunks` are the pipeline stages this rank
  // holds (model/pipeline_layout; empty: the whole model): only their layers are built, the
  // embeddings on the first stage, the final norm and head on the last (with tied embeddings
  // the last stage holds a copy of the token embedding, marked `pipeline_copy`).
  Transformer(const ModelConfig& config, Recompute recompute = Recompute::None,
              int64_t vocab_chunk = kDefaultVocabChunk,
              std::shared_ptr<const ParallelPlan> plan = nullptr, std::vector<ModelChunk> chunks = {});

  // GPT-2 / nanoGPT initialisation: N(0, 0.02) weights, residual output projections scaled by
  // 1/sqrt(2 n_layer) (Radford et al. 2019, section 2.3), zero biases, unit norm weights.
  // A sharded parameter draws its whole tensor and keeps its shard, so every layout starts
  // from the weights one process would.
  void init_weights(uint64_t seed);

  // Whole model only. Returns the sum of per-token losses over the batch (tokens and targets
  // are [batch, seq]). With compute_grad, also accumulates the output projection's gradient
  // and prepares the gradient of the final hidden states for backward().
  double forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len,
                 const ForwardOptions& options = {});
  // Accumulates every parameter's gradient (call after forward with compute_grad).
  void backward();

  // An activation set for chunk `chunk` (index into chunks()) of batch x seq_len tokens, on the
  // model's device and in its dtype.
  ChunkActivations make_activations(int64_t chunk, int64_t batch, int64_t seq_len);
  // One micro-batch through chunk `chunk`, keeping what its backward needs in `acts`. The
  // first stage embeds `tokens`; any other takes `input`, the previous stage's output
  // [local_rows, C] (any device, either float dtype: it is copied in). The last stage returns
  // the summed loss over `targets` (others 0) and, with compute_grad, its head gradient. The
  // chunk's output is acts.output(). `acts` may be empty or made for another chunk, shape or
  // device: it is made again then (a set made for a chunk of as many layers is kept, with what
  // the last stage adds), so a caller can reuse its sets.
  double forward_chunk(int64_t chunk, ChunkActivations& acts, const int32_t* tokens,
                       const int32_t* targets, const Tensor& input, int64_t batch, int64_t seq_len,
                       const ForwardOptions& options);
  // `acts` from this chunk's forward with compute_grad; `d_output` is the next stage's gradient
  // of the chunk's output (undefined on the last stage; any device and float dtype). Returns the
  // gradient of the chunk's input [local_rows, C], a view valid until the next backward_chunk,
  // or undefined on the first stage. `acts` may then serve another forward.
  //
  // With `weights`, the backward is split (kernels/weight_grads): this call is B, the input
  // gradient alone, and queues every parameter gradient into `weights`; running that list is
  // W, which also sums the sequence-parallel partial gradients over tp and reports the
  // gradients ready (so data-parallel buckets fill at W). `acts` may serve another forward as
  // soon as B returns: W reads its own copies. B then W equals the fused backward bit for bit.
  Tensor backward_chunk(int64_t chunk, ChunkActivations& acts, const Tensor& d_output,
                        ops::DeferredWeightGrads* weights = nullptr);
  const std::vector<ModelChunk>& chunks() const { return chunks_; }
  const ModelChunk& chunk(int64_t index) const;  // checks the index
  bool is_whole() const { return holds_embedding_ && holds_head_ && chunks_.size() == 1; }
  bool holds_embedding() const { return holds_embedding_; }
  bool holds_head() const { return holds_head_; }
  // Parameters whose gradient backward leaves for the caller to report ready
  // (report_grads_ready), because the caller completes it: a pipeline sums the parts of a tied
  // embedding that two stages hold.
  void defer_grads_ready(ParameterList params) { deferred_grads_ = std::move(params); }
  void report_grads_ready(const ParameterList& params) {
    if (grad_ready_hook_)
      for (Parameter* p : params) grad_ready_hook_(*p);
  }

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
  ParameterList unit_parameters(int64_t unit);  // whole model only
  const ParameterList& parameters() const { return parameters_; }
  const ModelConfig& config() const { return config_; }
  const ParallelPlan& plan() const { return *plan_; }

  // Mixture of experts: what the forwards since the last reset saw, summed over MoE layers
  // and micro-batches (recomputation does not count twice). `loss` is the objective's share,
  // sum of moe_aux_loss_coef x aux + moe_z_loss_coef x z per layer call; counts are the slots
  // routed to each expert (over all layers).
  struct MoeTotals {
    double aux = 0, z = 0, loss = 0;
    int64_t dropped = 0, routed = 0, layer_calls = 0;
    std::vector<std::vector<int64_t>> block_counts;  // per block of this rank, per expert
    std::vector<int64_t> expert_counts() const;      // per expert, summed over the blocks
  };
  const MoeTotals& moe_totals() const { return moe_totals_; }
  void reset_moe_totals() { moe_totals_ = MoeTotals{}; }
  // The sigmoid router's auxiliary-loss-free balancing: every MoE block's selection bias steps
  // by model.moe_bias_rate against its loads, `block_counts` as moe_totals() gives them (the
  // trainer sums them over replicas first); call once per optimizer step.
  void update_moe_bias(const std::vector<std::vector<int64_t>>& block_counts);
  // Every MoE layer's selection bias, [n_layer x n_experts] by global layer (zeros for layers
  // this rank does not hold), and the inverse, which sets the held layers'.
  std::vector<float> moe_biases() const;
  void set_moe_biases(const std::vector<float>& biases);
  // Moves the parameters (values in `compute_dtype`, gradients F32) onto `device`; activation
  // sets are made again there at their next forward (a set awaiting its backward is refused). The
  // CPU computes in F32 (bf16 is emulated there: set_bf16_activations); CUDA in F32 or BF16, whose
  // parameter values are then the bf16 working copies of masters the optimizer keeps. Parameter
  // values are converted, gradients zeroed. Call before anything holds the parameters' tensors
  // (optimizers, data parallelism).
  void to_device(Device device, DType compute_dtype);
  Device device() const { return format_.device; }
  DType compute_dtype() const { return format_.dtype; }
  void set_bf16_activations(bool on);
  // FP8 training (model/fp8_linear.hpp): every block's attention and MLP projections run their
  // GEMMs on FP8-quantised operands from now on; embeddings, norms, attention's softmax, the
  // router, the output head and the loss stay in f32. One process's layers only (a loom::Error
  // otherwise). The returned state (scales, amax histories) belongs to the model.
  Fp8Training& enable_fp8(const Fp8Config& config);
  Fp8Training* fp8() { return fp8_.get(); }
  Recompute recompute() const { return recompute_; }
  // Packed documents: with an end-of-document token, every token attends only to its own
  // document (the tokens after the last `eot_token` before it, up to itself; the end token
  // closes its document). With `restart_positions` each token's position (RoPE's angle, GPT-2's
  // position row) counts from its document's first token instead of the sequence's. Needs the
  // tokens on every pipeline stage. -1 (the default) turns it off: plain causal attention over
  // the whole sequence.
  void set_document_mask(int32_t eot_token, bool restart_positions = false);
  bool restarts_positions() const { return restart_positions_; }
  int32_t document_mask_token() const { return eot_token_; }
  // The key ranges set_document_mask gives batch x seq_len tokens: (begin, end) per token.
  static std::vector<int32_t> document_key_ranges(const int32_t* tokens, int64_t batch,
                                                  int64_t seq_len, int32_t eot_token);
  // Context parallelism: every cp rank of the model is given the same whole sequences and keeps
  // its two chunks of each (model/context_parallel): its tokens, targets, global positions and
  // key ranges; `cp` carries attention across the ranks (null: off). The summed loss forward
  // returns is over this rank's tokens. Sequence lengths must split into 2 x cp chunks.
  void set_context_parallel(std::shared_ptr<ContextAttention> cp);
  const ContextSplit& context_split() const { return cp_split_; }
  // Rows of a chunk's input and output on this rank for batch x seq_len tokens of whole
  // sequences: this rank's chunks, and its share of them under sequence parallelism.
  int64_t local_rows(int64_t batch, int64_t seq_len) const {
    return plan_->local_rows(batch * cp_split_.local_len(seq_len));
  }
  // Output projection: the token embedding when tied, else lm_head.
  const Parameter& output_weight() const { return config_.tied_embeddings ? token_embedding : lm_head; }

  // Parameters a stage does not hold are left empty (no name, no storage). With tied
  // embeddings a stage that holds the head but not the embeddings holds a copy of the token
  // embedding (`pipeline_copy`), its output projection.
  Parameter token_embedding;     // this rank's vocabulary rows under tensor parallelism
  Parameter position_embedding;  // GPT-2 only
  bool has_position_embedding() const { return config_.arch == Architecture::GPT2 && holds_embedding_; }
  std::vector<std::unique_ptr<TransformerBlock>> blocks;  // the held layers, in order
  std::unique_ptr<Norm> final_norm;  // last stage only
  Parameter lm_head;  // untied models only; the same vocabulary rows as token_embedding

 private:
  // Sizes the scratch every activation set shares (gradient buffers, recomputation stashes).
  void ensure_shape(int64_t batch, int64_t seq_len);
  // Makes `a` fit chunk `chunk` of the current shape and format (see forward_chunk).
  void fit_activations(int64_t chunk, ChunkActivations& a);
  void check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len) const;
  // Embeds or copies the input, runs the chunk's blocks and, on the last stage, the final norm.
  void forward_layers(int64_t chunk, ChunkActivations& a, const Tensor& input);
  EmbeddingArgs embedding_args(const ChunkActivations& a) const;
  BlockStash& stash_of(ChunkActivations& a, int64_t block_in_chunk);
  // Runs `run` with the gradients of `params` pointed at zeroed scratch, then sums that over
  // tp and adds it to the real gradients: under sequence parallelism these gradients are
  // partial, and the sum must cover this backward's part only, not earlier micro-batches'.
  // One part of a backward (the head's norm, a block, the embeddings): `run` computes it;
  // `partial` are its parameters whose gradients are this rank's rows' alone under sequence
  // parallelism (with_partial_grads), `ready` those whose gradients are then final. With
  // `weights`, run's parameter gradients are queued there, followed by the partial sums and
  // the ready report.
  template <typename Run>
  void backward_part(const ParameterList& partial, const ParameterList& ready,
                     ops::DeferredWeightGrads* weights, Run run);
  template <typename Run>
  void with_partial_grads(const ParameterList& params, Run run);
  void add_parameter(Parameter& p, int64_t init_index);
  void add_moe_totals(int64_t block, const MoeStash& stash);
  MoeTotals moe_totals_;

  ModelConfig config_;
  std::shared_ptr<const ParallelPlan> plan_;
  Recompute recompute_;
  int64_t vocab_chunk_;
  std::vector<ModelChunk> chunks_;
  std::unique_ptr<Fp8Training> fp8_;
  std::vector<int64_t> chunk_first_block_;  // index into `blocks` of each chunk's first layer
  bool holds_embedding_ = true, holds_head_ = true;
  std::shared_ptr<const ops::Rope> rope_;
  std::shared_ptr<SequenceLayout> layout_ = std::make_shared<SequenceLayout>();  // every block's
  int32_t eot_token_ = -1;
  bool restart_positions_ = false;
  std::shared_ptr<ContextAttention> cp_;
  ContextSplit cp_split_;  // size 1 without context parallelism
  std::vector<int32_t> local_targets_;  // this cp rank's targets of the micro-batch in hand
  // Points the blocks' mask at `a`'s ranges (empty: causal) for the chunk about to run.
  void use_layout_of(const ChunkActivations& a) {
    layout_->key_ranges = a.key_ranges;
    layout_->positions = a.positions;
    layout_->window_key_ranges = a.window_key_ranges;
  }
  // Fills a's key ranges and positions for batch x seq_len tokens of whole sequences (this cp
  // rank's rows of them; empty for plain causal attention on one rank), and the sliding-window
  // layers' ranges (empty without a window).
  void fill_sequence_layout(ChunkActivations& a, const int32_t* tokens, int64_t batch, int64_t seq_len) const;
  ActivationFormat format_;
  ParameterList parameters_;
  // Position of each parameter in the whole model's list: its initialisation stream, so every
  // pipeline layout starts from the weights one process would.
  std::vector<int64_t> init_index_;
  std::vector<ParameterList> block_parameters_;
  GradReadyHook grad_ready_hook_;
  ParameterList deferred_grads_;
  UnitHooks unit_hooks_;
  void grads_ready(const ParameterList& params);
  static void fire(const std::function<void(int64_t)>& hook, int64_t unit) {
    if (hook) hook(unit);
  }

  // Scratch for the current (batch, seq_len), shared by every activation set. Rows are this
  // rank's (ParallelPlan::local_rows).
  int64_t batch_ = 0, seq_len_ = 0;
  ChunkActivations whole_;           // forward(), backward() and last_logits() of the whole model
  BlockStash full_recompute_stash_;  // Full: the one stash every block recomputes into
  BlockStash selective_shared_;      // Selective: the recomputables every block shares
  BlockGradScratch scratch_;
  Tensor logits_chunk_;     // [rows, vocab_chunk] cross-entropy scratch
  Tensor d_residual_;       // the residual stream's gradient, carried through the blocks in place
  bool bf16_activations_ = false;
};

}  // namespace loom
