#include "loom/parallel/tensor_parallel_plan.hpp"

#include <algorithm>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_linear.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom {

namespace {

// Several column-parallel projections of one input (Llama's q, k, v under their own names, or
// one fused c_attn), run by column_parallel_forward / _backward: the input is gathered once
// under sequence parallelism, and the summed d_input is reduced once, overlapped with the
// weight gradients.
class ColumnParallelFanOut final : public FanOutProjection {
 public:
  ColumnParallelFanOut(const FanOutSpec& spec, const std::shared_ptr<ProcessGroup>& group,
                       bool sequence_parallel) {
    for (const ProjectionPart& part : spec.parts) {
      owned_.push_back(std::make_unique<ColumnParallelLinear>(
          part.name, spec.in_features, part.segments, spec.bias, group, sequence_parallel,
          spec.hf_transposed));
      layers_.push_back(owned_.back().get());
      width_ += layers_.back()->local_out_features();
    }
  }

  void forward(const Tensor& out, const Tensor& input) override {
    column_parallel_forward(layers_, out, input, scratch_);
  }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    column_parallel_backward(layers_, d_input, false, d_out, 0, input, scratch_);
  }
  int64_t width() const override { return width_; }
  void collect(ParameterList& out) override {
    for (ColumnParallelLinear* layer : layers_) layer->collect(out);
  }
  std::vector<Linear*> linears() override {  // each rank's shards (FP8 swaps their GEMMs)
    std::vector<Linear*> out;
    for (ColumnParallelLinear* layer : layers_) out.push_back(&layer->local);
    return out;
  }

 private:
  std::vector<std::unique_ptr<ColumnParallelLinear>> owned_;
  std::vector<ColumnParallelLinear*> layers_;
  int64_t width_ = 0;
  ColumnParallelLinear::Scratch scratch_;
};

class RowParallelFanIn final : public FanInProjection {
 public:
  RowParallelFanIn(const FanInSpec& spec, const std::shared_ptr<ProcessGroup>& group,
                   bool sequence_parallel)
      : layer_(spec.name, spec.in_features, spec.out_features, spec.bias, group, sequence_parallel,
               spec.hf_transposed) {}
  void forward(const Tensor& out, const Tensor& input) override { layer_.forward(out, input); }
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) override {
    layer_.backward(d_input, false, d_out, input);
  }
  void collect(ParameterList& out) override { layer_.collect(out); }
  std::vector<Linear*> linears() override { return {&layer_.local}; }
  ParameterList partial_grads() override { return layer_.sequence_parallel_partial_grads(); }

 private:
  RowParallelLinear layer_;
};

VocabLookup vocab_lookup(const EmbeddingArgs& a, int rank, int ranks, bool sequence_parallel) {
  const ShardRange owned = shard_range(a.vocab, rank, ranks);
  return {a.tokens,    a.batch * a.seq_len,        a.dim,
          owned.begin, owned.begin + owned.length, sequence_parallel};
}

}  // namespace

TensorParallelPlan::TensorParallelPlan(std::shared_ptr<ProcessGroup> tp_group,
                                       bool sequence_parallel)
    : group_(std::move(tp_group)), sequence_parallel_(sequence_parallel) {
  if (!group_) throw_error("TensorParallelPlan: no tp process group given");
}

std::unique_ptr<FanOutProjection> TensorParallelPlan::fan_out(const FanOutSpec& spec) const {
  return std::make_unique<ColumnParallelFanOut>(spec, group_, sequence_parallel_);
}

std::unique_ptr<FanInProjection> TensorParallelPlan::fan_in(const FanInSpec& spec) const {
  return std::make_unique<RowParallelFanIn>(spec, group_, sequence_parallel_);
}

int64_t TensorParallelPlan::first_local_row(int64_t rows) const {
  return sequence_parallel_ ? tp_rank() * local_rows(rows) : 0;
}

void TensorParallelPlan::embed(const Tensor& out, const EmbeddingArgs& a) const {
  vocab_parallel_lookup(out, a.token_table->value,
                        vocab_lookup(a, tp_rank(), tp(), sequence_parallel_), *group_,
                        lookup_scratch_);
  // Position rows after the sum: every rank adds them to the rows it holds, once.
  if (a.position_table)
    ops::add_position_rows(out, a.position_table->value, first_local_row(a.batch * a.seq_len),
                           a.seq_len, a.positions);
}

void TensorParallelPlan::embed_backward(const Tensor& d_out, const EmbeddingArgs& a) const {
  if (a.position_table)  // this rank's rows only under sequence parallelism: a partial sum
    ops::position_rows_backward(a.position_table->grad, d_out, first_local_row(a.batch * a.seq_len),
                                a.seq_len, a.positions);
  vocab_parallel_lookup_backward(a.token_table->grad, d_out,
                                 vocab_lookup(a, tp_rank(), tp(), sequence_parallel_), *group_,
                                 lookup_scratch_);
}

double TensorParallelPlan::head_loss(const ops::CrossEntropyArgs& a, int64_t rows,
                                     int64_t vocab) const {
  VocabParallelCrossEntropyArgs args;
  args.hidden = a.hidden;
  args.weight = a.weight;
  args.targets = a.targets;
  args.rows = rows;
  args.vocab = vocab;
  args.vocab_chunk = a.vocab_chunk;
  args.grad_scale = a.grad_scale;
  args.d_hidden = a.d_hidden;
  args.d_weight = a.d_weight;
  args.workspace = a.workspace;
  args.sequence_parallel = sequence_parallel_;
  args.loss_sum = a.loss_sum;
  return vocab_parallel_cross_entropy(args, *group_);
}

std::vector<float> TensorParallelPlan::last_position_logits(const Tensor& hidden_local,
                                                            const Tensor& head, int64_t batch,
                                                            int64_t seq_len, int64_t vocab) const {
  const int64_t rows = batch * seq_len, dim = hidden_local.size(1);
  Tensor hidden = hidden_local;
  if (sequence_parallel_ && tp() > 1) {
    hidden = Tensor::empty({rows, dim}, hidden_local.dtype(), MemCategory::Workspace,
                           hidden_local.device());
    gather_sequence_rows(*group_, hidden_local, hidden)->wait();
  }
  // Each rank's logits over its vocabulary block, padded to the largest block so one
  // all-gather collects them; then unpadded in rank order. One row at a time, as the
  // one-process plan does.
  const int64_t block = shard_range(vocab, 0, tp()).length;
  const ShardRange owned = shard_range(vocab, tp_rank(), tp());
  Tensor mine =
      Tensor::zeros({batch, block}, hidden.dtype(), MemCategory::Workspace, hidden.device());
  Tensor all =
      Tensor::empty({tp() * batch, block}, hidden.dtype(), MemCategory::Workspace, hidden.device());
  if (owned.length > 0)
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t last = b * seq_len + seq_len - 1;
      ops::linear_forward(mine.narrow_rows(b, b + 1), 0, hidden.narrow_rows(last, last + 1), head,
                          nullptr);
    }
  gather_sequence_rows(*group_, mine, all)->wait();
  const std::vector<float> gathered = all.to_f32_vector();
  std::vector<float> result(static_cast<size_t>(batch * vocab));
  for (int r = 0; r < tp(); ++r) {
    const ShardRange range = shard_range(vocab, r, tp());
    for (int64_t b = 0; b < batch; ++b)
      std::copy_n(gathered.data() + (r * batch + b) * block, range.length,
                  result.data() + b * vocab + range.begin);
  }
  return result;
}

void TensorParallelPlan::sum_partial_grads(const ParameterList& params) const {
  all_reduce_sequence_parallel_grads(params, *group_);
}

}  // namespace loom
