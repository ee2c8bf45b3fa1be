#pragma once
// How the model's layers are laid out over tensor parallelism. The model code is written once,
// against this interface: it asks its plan for the two halves of attention and of the MLP,
// and hands the plan its vocabulary work (token lookup, the fused output head and loss). This
// base class is one process: plain Linear layers and the CPU kernels, no communication.
// parallel/tensor_parallel_plan swaps in Megatron's column- and row-parallel layers, the
// vocabulary-parallel embedding and loss, and sequence parallelism. Because the layers come
// from the plan, the stash shapes (heads and MLP columns per rank, rows of the residual
// stream per rank) come from it too.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/kernels/ops.hpp"
#include "loom/model/config.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

class ExpertExchange;  // model/moe.hpp
class Linear;          // model/linear.hpp

// One projection of a fan-out layer: its HF name (without ".weight") and its output width, as
// the widths of the tensors it fuses (GPT-2's c_attn = {C, C, C} for q|k|v), each of which
// tensor parallelism splits on its own.
struct ProjectionPart {
  std::string name;
  std::vector<int64_t> segments;
};

struct FanOutSpec {
  std::vector<ProjectionPart> parts;  // projections of one input, outputs side by side
  int64_t in_features = 0;
  bool bias = false, hf_transposed = false;
};

struct FanInSpec {
  std::string name;
  int64_t in_features = 0, out_features = 0;
  bool bias = false, hf_transposed = false;
};

// The first half of attention or of the MLP: the block's normalised input to several
// projections whose outputs sit side by side in one activation (q|k|v, gate|up).
class FanOutProjection {
 public:
  virtual ~FanOutProjection() = default;
  // input: [plan.local_rows(rows), in]. out: [rows, width()].
  virtual void forward(const Tensor& out, const Tensor& input) = 0;
  // d_input, shaped like input, written; parameter gradients accumulated.
  virtual void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) = 0;
  virtual int64_t width() const = 0;  // this rank's output columns
  virtual void collect(ParameterList& out) = 0;
  // Its Linear layers (under tensor parallelism each rank's shards; FP8 training swaps their
  // GEMMs).
  virtual std::vector<Linear*> linears() { return {}; }
  // pre = forward(input) and act = gelu(pre) from one product (ops::linear_gelu_forward), where
  // this projection and the device can; false, having written nothing, where not.
  virtual bool forward_gelu(const Tensor& act, const Tensor& pre, const Tensor& input) {
    (void)act, (void)pre, (void)input;
    return false;
  }
};

// The second half: [rows, this rank's input columns] to the block's [local_rows, out].
class FanInProjection {
 public:
  virtual ~FanInProjection() = default;
  virtual void forward(const Tensor& out, const Tensor& input) = 0;
  // d_input [rows, this rank's input columns] written; parameter gradients accumulated.
  virtual void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) = 0;
  virtual void collect(ParameterList& out) = 0;
  virtual std::vector<Linear*> linears() { return {}; }  // as FanOutProjection's
  // Parameters whose gradient comes from this rank's rows only (see sum_partial_grads).
  virtual ParameterList partial_grads() { return {}; }
  // backward(d_input, d_out, input) with input = gelu(pre), carried through the GELU: d_pre
  // written (ops::linear_backward_through_gelu), where this projection and the device can;
  // false, having written nothing, where not.
  virtual bool backward_through_gelu(const Tensor& d_pre, const Tensor& d_out, const Tensor& input,
                                     const Tensor& pre) {
    (void)d_pre, (void)d_out, (void)input, (void)pre;
    return false;
  }
};

// Heads and MLP columns on one rank.
struct LocalDims {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

struct EmbeddingArgs {
  const int32_t* tokens = nullptr;          // [batch * seq_len] on the host, the same on every
                                            // tp rank
  const Parameter* token_table = nullptr;   // this rank's rows of [vocab, dim]
  const Parameter* position_table = nullptr;  // [max_seq_len, dim] (GPT-2) or null
  std::span<const int32_t> positions;         // per token (positions restarting per document),
                                              // or empty: each token's index in its sequence
  int64_t batch = 0, seq_len = 0, dim = 0, vocab = 0;
};

class ParallelPlan {
 public:
  virtual ~ParallelPlan() = default;
  virtual int tp() const { return 1; }
  virtual int tp_rank() const { return 0; }
  virtual bool sequence_parallel() const { return false; }
  // Rows of the residual stream this rank holds: all of them, or rows / tp under sequence
  // parallelism (rows must divide).
  int64_t local_rows(int64_t rows) const;
  // The model's heads and MLP width split over tp, or a loom::Error saying what divides.
  LocalDims local_dims(const ModelConfig& config) const;

  virtual std::unique_ptr<FanOutProjection> fan_out(const FanOutSpec& spec) const;
  virtual std::unique_ptr<FanInProjection> fan_in(const FanInSpec& spec) const;
  // Where a [vocab, dim] table (token embedding, output head) lives: this rank's rows.
  virtual Placement vocab_placement(int64_t vocab, int64_t dim) const;

  // out: [local_rows, dim] token (+ position) embeddings of this rank's rows.
  virtual void embed(const Tensor& out, const EmbeddingArgs& args) const;
  // d_out shaped like embed's out; accumulates the tables' gradients.
  virtual void embed_backward(const Tensor& d_out, const EmbeddingArgs& args) const;
  // The fused head + cross-entropy (ops::lm_head_cross_entropy's contract) with args.hidden
  // and args.d_hidden this rank's [local_rows, dim], args.weight and args.d_weight this rank's
  // head rows, and args.targets all `rows` targets; `vocab` is the full vocabulary. Returns the
  // summed loss, every rank; or, where the plan adds it into args.loss_sum (set), 0. A plan
  // whose loss is on the host anyway may leave args.loss_sum alone and return it.
  virtual double head_loss(const ops::CrossEntropyArgs& args, int64_t rows, int64_t vocab) const;
  // [batch, vocab] logits of the last position of each sequence, on the host; hidden as
  // head_loss's, head this rank's rows.
  virtual std::vector<float> last_position_logits(const Tensor& hidden, const Tensor& head,
                                                  int64_t batch, int64_t seq_len,
                                                  int64_t vocab) const;
  // Sums `params`' gradients over tp. Under sequence parallelism a parameter applied to this
  // rank's rows only (norms, row-parallel biases, the position table) gets a partial gradient;
  // the model calls this once per backward on gradients holding that backward's part alone.
  virtual void sum_partial_grads(const ParameterList& params) const { (void)params; }

  // Expert parallelism, on any plan: the exchange over the ep group that mixture-of-experts
  // layers dispatch their tokens through (null: every expert on this rank). Set before the
  // model is built.
  void set_expert_exchange(std::shared_ptr<ExpertExchange> exchange) { expert_exchange_ = std::move(exchange); }
  ExpertExchange* expert_exchange() const { return expert_exchange_.get(); }

 private:
  std::shared_ptr<ExpertExchange> expert_exchange_;
};

// The one-process plan, shared by every model that is not given another.
std::shared_ptr<const ParallelPlan> single_process_plan();

}  // namespace loom
