#include "loom/parallel/vocab_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/parallel/tensor_parallel.hpp"

namespace loom {

// ---------------------------------------------------------------------------------------------
// VocabParallelEmbedding

VocabParallelEmbedding::VocabParallelEmbedding(std::string name, int64_t vocab, int64_t dim,
                                               std::shared_ptr<ProcessGroup> group,
                                               bool sequence_parallel)
    : layer_("VocabParallelEmbedding '" + name + "'"),
      vocab_(vocab),
      dim_(dim),
      group_(std::move(group)),
      sequence_parallel_(sequence_parallel) {
  if (vocab < group_->size())
    throw_error(layer_, ": vocab = ", vocab, " is smaller than tp = ", group_->size());
  const Placement placement = shard_placement({vocab, dim}, 0, group_->rank(), group_->size());
  vocab_begin_ = shard_range(vocab, group_->rank(), group_->size()).begin;
  allocate_parameter(weight, std::move(name), shard_shape(placement), true);
  weight.placement = placement;
}

VocabLookup VocabParallelEmbedding::lookup(const int32_t* tokens, int64_t rows) const {
  return {tokens, rows, dim_, vocab_begin_, vocab_end(), sequence_parallel_};
}

void VocabParallelEmbedding::forward(const Tensor& out, const int32_t* tokens, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    if (tokens[r] < 0 || tokens[r] >= vocab_)
      throw_error(layer_, ": token ", tokens[r], " at row ", r, " is outside [0, ", vocab_, ")");
  if (sequence_parallel_) (void)sequence_shard_rows(layer_, rows, group_->size());
  vocab_parallel_lookup(out, weight.value, lookup(tokens, rows), *group_, full_rows_);
}

void VocabParallelEmbedding::backward(const Tensor& d_out, const int32_t* tokens, int64_t rows) {
  vocab_parallel_lookup_backward(weight.grad, d_out, lookup(tokens, rows), *group_, full_rows_);
}

void vocab_parallel_lookup(const Tensor& out, const Tensor& table, const VocabLookup& l,
                           ProcessGroup& tp, Tensor& scratch) {
  const bool split_rows = l.sequence_parallel && tp.size() > 1;
  LOOM_CHECK(table.size(0) == l.vocab_end - l.vocab_begin, "vocab_parallel_lookup: a table of ",
             table.size(0), " rows for ids [", l.vocab_begin, ", ", l.vocab_end, ")");
  const Tensor lookups = split_rows ? reserve_like(scratch, l.rows, l.dim, out) : out;
  ops::embedding_shard_forward(lookups, l.tokens, table, l.vocab_begin);
  // Exactly one rank contributed each row, so the sum is that rank's lookup.
  if (split_rows)
    reduce_scatter_sequence_rows(tp, lookups, out)->wait();
  else
    comm::all_reduce(tp, out, ReduceOp::Sum)->wait();
}

void vocab_parallel_lookup_backward(const Tensor& table_grad, const Tensor& d_out,
                                    const VocabLookup& l, ProcessGroup& tp, Tensor& scratch) {
  Tensor full = d_out;
  if (l.sequence_parallel && tp.size() > 1) {
    full = reserve_like(scratch, l.rows, l.dim, d_out);
    gather_sequence_rows(tp, d_out, full)->wait();
  }
  ops::embedding_shard_backward(table_grad, full, l.tokens, l.vocab_begin);
}

void VocabParallelEmbedding::load_full(const Tensor& full_table) {
  if (full_table.shape() != Shape{vocab_, dim_})
    throw_error(layer_, ": full table is ", shape_to_string(full_table.shape()), ", expected ",
                shape_to_string({vocab_, dim_}));
  weight.value.copy_from(take_shard(full_table, weight.placement));
}

// ---------------------------------------------------------------------------------------------
// vocab_parallel_cross_entropy
//
// The two passes follow cpu::lm_head_cross_entropy (kernels/cpu/cross_entropy.cpp) over this
// rank's shard; that kernel cannot be called as is, since it normalises by its own shard's
// log-sum-exp, and the communication has to sit between its passes.

double vocab_parallel_cross_entropy(const VocabParallelCrossEntropyArgs& a, ProcessGroup& tp) {
  const char* layer = "vocab_parallel_cross_entropy";
  const int ranks = tp.size();
  if (a.vocab < ranks) throw_error(layer, ": vocab = ", a.vocab, " is smaller than tp = ", ranks);
  const ShardRange owned = shard_range(a.vocab, tp.rank(), ranks);  // may be uneven
  const int64_t shard = owned.length, rows = a.rows, dim = a.hidden.size(1);
  if (a.weight.size(0) != shard)
    throw_error(layer, ": rank ", tp.rank(), "'s head has ", a.weight.size(0),
                " rows, its share of ", a.vocab, " is ", shard);
  const bool split_rows = a.sequence_parallel && ranks > 1;
  if (a.sequence_parallel) (void)sequence_shard_rows(layer, rows, ranks);
  const Device device = a.hidden.device();

  ops::ShardLogitsArgs s;
  s.hidden = a.hidden;
  if (split_rows) {
    s.hidden = Tensor::empty({rows, dim}, a.hidden.dtype(), MemCategory::Workspace, device);
    gather_sequence_rows(tp, a.hidden, s.hidden)->wait();
  }
  s.weight = a.weight;
  s.targets = a.targets;
  s.vocab_begin = owned.begin;
  s.vocab_chunk = a.vocab_chunk;
  const int64_t chunk = std::max<int64_t>(std::min(a.vocab_chunk, shard), 1);
  s.workspace = a.workspace;
  if (!s.workspace.defined() || s.workspace.numel() < rows * chunk ||
      s.workspace.device() != device || s.workspace.dtype() != DType::F32)
    s.workspace = Tensor::empty({rows, chunk}, DType::F32, MemCategory::Workspace, device);

  // Pass 1 over the shard: max and sum of exp per row, and the owned target logits, on the
  // model's device, reduced over the ranks there (comm stages them where the group needs): no
  // host round trip on NCCL.
  Tensor stats = Tensor::empty({3, rows}, DType::F32, MemCategory::Workspace, device);
  ops::shard_logit_stats(s, stats);
  Tensor global_max = Tensor::empty({rows}, DType::F32, MemCategory::Workspace, device);
  global_max.copy_from(stats.narrow_rows(0, 1));
  comm::all_reduce(tp, global_max, ReduceOp::Max)->wait();
  ops::shard_rescale_sums(stats, global_max);
  comm::all_reduce(tp, stats.narrow_rows(1, 3), ReduceOp::Sum)->wait();  // sums | targets
  Tensor lse = Tensor::empty({rows}, DType::F32, MemCategory::Workspace, device);
  const double total = ops::shard_loss(lse, stats, global_max, a.targets, a.row_losses, a.loss_sum);
  if (!a.d_hidden.defined() && !a.d_weight.defined()) return total;

  // Pass 2: this rank's columns of grad_scale * (softmax - onehot), chunk by chunk, into
  // d_hidden's partial sum (over the whole rows) and the shard's weight gradient.
  Tensor d_hidden = a.d_hidden;
  if (a.d_hidden.defined() && split_rows)
    d_hidden = Tensor::empty({rows, dim}, a.d_hidden.dtype(), MemCategory::Workspace, device);
  ops::shard_logit_grad(s, lse, a.grad_scale, d_hidden, a.d_weight);
  if (a.d_hidden.defined()) {
    if (split_rows)
      reduce_scatter_sequence_rows(tp, d_hidden, a.d_hidden)->wait();
    else
      comm::all_reduce(tp, a.d_hidden, ReduceOp::Sum)->wait();
  }
  return total;
}

}  // namespace loom
