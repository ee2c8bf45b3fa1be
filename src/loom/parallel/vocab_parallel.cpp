#include "loom/parallel/vocab_parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/fast_math.hpp"
#include "loom/kernels/cpu/gemm.hpp"
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

void VocabParallelEmbedding::forward(float* out, const int32_t* tokens, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    if (tokens[r] < 0 || tokens[r] >= vocab_)
      throw_error(layer_, ": token ", tokens[r], " at row ", r, " is outside [0, ", vocab_, ")");
  if (sequence_parallel_) (void)sequence_shard_rows(layer_, rows, group_->size());
  vocab_parallel_lookup(out, weight.value.f32(), lookup(tokens, rows), *group_, full_rows_);
}

void VocabParallelEmbedding::backward(const float* d_out, const int32_t* tokens, int64_t rows) {
  vocab_parallel_lookup_backward(weight.grad.f32(), d_out, lookup(tokens, rows), *group_,
                                 full_rows_);
}

void vocab_parallel_lookup(float* out, const float* table, const VocabLookup& l, ProcessGroup& tp,
                           Tensor& scratch) {
  const bool split_rows = l.sequence_parallel && tp.size() > 1;
  const int64_t dim = l.dim, begin = l.vocab_begin, end = l.vocab_end;
  float* lookups = split_rows ? reserve_f32(scratch, l.rows * dim, MemCategory::Workspace) : out;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < l.rows; ++r) {
    float* dst = lookups + r * dim;
    const int64_t t = l.tokens[r];
    if (t >= begin && t < end)
      std::copy_n(table + (t - begin) * dim, dim, dst);
    else
      std::fill_n(dst, dim, 0.0f);
  }
  // Exactly one rank contributed each row, so the sum is that rank's lookup.
  if (split_rows)
    reduce_scatter_sequence_rows(tp, lookups, out, l.rows / tp.size(), dim)->wait();
  else
    tp.all_reduce(out, l.rows * dim, ReduceOp::Sum)->wait();
}

void vocab_parallel_lookup_backward(float* table_grad, const float* d_out, const VocabLookup& l,
                                    ProcessGroup& tp, Tensor& scratch) {
  const int64_t dim = l.dim, begin = l.vocab_begin, end = l.vocab_end;
  const float* full = d_out;
  if (l.sequence_parallel && tp.size() > 1) {
    float* gathered = reserve_f32(scratch, l.rows * dim, MemCategory::Workspace);
    gather_sequence_rows(tp, d_out, gathered, l.rows / tp.size(), dim)->wait();
    full = gathered;
  }
  // As cpu::embedding_backward: threads split the channels, so repeated tokens never race.
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t c0 = dim * thread / threads, c1 = dim * (thread + 1) / threads;
    for (int64_t r = 0; r < l.rows; ++r) {
      const int64_t t = l.tokens[r];
      if (t < begin || t >= end) continue;
      const float* src = full + r * dim;
      float* dst = table_grad + (t - begin) * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
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
  const int64_t shard = owned.length, v_begin = owned.begin, rows = a.rows, dim = a.dim;
  const bool split_rows = a.sequence_parallel && ranks > 1;
  const int64_t local_rows = a.sequence_parallel ? sequence_shard_rows(layer, rows, ranks) : rows;

  Tensor gathered;
  const float* hidden = a.hidden;
  if (split_rows) {
    gathered = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
    gather_sequence_rows(tp, a.hidden, gathered.f32(), local_rows, dim)->wait();
    hidden = gathered.f32();
  }
  const int64_t chunk = std::max<int64_t>(std::min(a.vocab_chunk, shard), 1);
  const int64_t chunks = (shard + chunk - 1) / chunk;
  Tensor logits = Tensor::empty({rows, chunk}, DType::F32, MemCategory::Workspace);
  float* z = logits.f32();
  auto chunk_logits = [&](int64_t v0, int64_t width) {
    cpu::sgemm(false, true, rows, width, dim, 1.0f, hidden, dim, a.weight + v0 * dim, dim, 0.0f, z,
               chunk);
  };

  // Pass 1 over the shard: online max and sum of exp per row, and the owned target logits.
  const auto n = static_cast<size_t>(rows);
  std::vector<float> local_max(n, -std::numeric_limits<float>::infinity()), global_max(n);
  std::vector<float> sums(2 * n, 0.0f);  // [sum of exp | target logit], one all-reduce for both
  float* row_sum = sums.data();
  float* target_logit = sums.data() + rows;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, shard - v0);
    chunk_logits(v0, width);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* zr = z + r * chunk;
      float m = local_max[r];
      for (int64_t j = 0; j < width; ++j) m = std::max(m, zr[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < width; ++j) sum += cpu::fast_exp(zr[j] - m);
      row_sum[r] = row_sum[r] * std::exp(local_max[r] - m) + sum;
      local_max[r] = m;
      const int64_t t = a.targets[r] - v_begin;  // negative targets never land in [v0, v0+width)
      if (a.targets[r] >= 0 && t >= v0 && t < v0 + width) target_logit[r] = zr[t - v0];
    }
  }
  std::copy(local_max.begin(), local_max.end(), global_max.begin());
  tp.all_reduce(global_max.data(), rows, ReduceOp::Max)->wait();
  for (int64_t r = 0; r < rows; ++r) row_sum[r] *= std::exp(local_max[r] - global_max[r]);
  tp.all_reduce(sums.data(), 2 * rows, ReduceOp::Sum)->wait();

  std::vector<float> lse(n);
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = global_max[r] + std::log(row_sum[r]);
    const float loss = a.targets[r] >= 0 ? lse[r] - target_logit[r] : 0.0f;
    if (a.row_losses) a.row_losses[r] = loss;
    total += loss;
  }
  if (!a.d_hidden && !a.d_weight) return total;

  // Pass 2: this rank's columns of grad_scale * (softmax - onehot), chunk by chunk, into
  // d_hidden's partial sum (over the whole rows) and the shard's weight gradient.
  Tensor partial_owned;
  float* d_hidden = a.d_hidden;
  if (a.d_hidden && split_rows) {
    partial_owned = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
    d_hidden = partial_owned.f32();
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, shard - v0);
    if (chunks > 1) chunk_logits(v0, width);  // one chunk: pass 1's logits are still in z
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* zr = z + r * chunk;
      if (a.targets[r] < 0) {
        std::fill(zr, zr + width, 0.0f);
        continue;
      }
      const float row_lse = lse[r];
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) zr[j] = a.grad_scale * cpu::fast_exp(zr[j] - row_lse);
      const int64_t t = a.targets[r] - v_begin;
      if (t >= v0 && t < v0 + width) zr[t - v0] -= a.grad_scale;
    }
    if (d_hidden)
      cpu::sgemm(false, false, rows, dim, width, 1.0f, z, chunk, a.weight + v0 * dim, dim,
                 c == 0 ? 0.0f : 1.0f, d_hidden, dim);
    if (a.d_weight)
      cpu::sgemm(true, false, width, dim, rows, 1.0f, z, chunk, hidden, dim, 1.0f,
                 a.d_weight + v0 * dim, dim);
  }
  if (a.d_hidden) {
    if (split_rows)
      reduce_scatter_sequence_rows(tp, d_hidden, a.d_hidden, local_rows, dim)->wait();
    else
      tp.all_reduce(a.d_hidden, rows * dim, ReduceOp::Sum)->wait();
  }
  return total;
}

}  // namespace loom
