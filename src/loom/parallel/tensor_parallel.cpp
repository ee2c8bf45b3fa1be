#include "loom/parallel/tensor_parallel.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "loom/core/error.hpp"

namespace loom {

int64_t tp_shard_size(std::string_view layer, std::string_view dimension, int64_t full, int tp) {
  if (tp < 1) throw_error(layer, ": tp = ", tp, ", expected a positive group size");
  if (full <= 0 || full % tp != 0)
    throw_error(layer, ": ", dimension, " = ", full, " does not divide by tp = ", tp,
                " (tensor parallelism splits it into equal shards)");
  return full / tp;
}

Tensor row_shard(const Tensor& full, int rank, int ranks, const std::vector<int64_t>& segments,
                 MemCategory category) {
  if (full.dim() < 1) throw_error("row_shard: expected a tensor with at least one axis");
  const int64_t rows = full.size(0), cols = full.numel() / std::max<int64_t>(rows, 1);
  const std::string what = "row_shard of a " + shape_to_string(full.shape()) + " tensor";
  std::vector<int64_t> pieces = segments.empty() ? std::vector<int64_t>{rows} : segments;
  if (std::accumulate(pieces.begin(), pieces.end(), int64_t{0}) != rows)
    throw_error(what, ": its segments add up to ",
                std::accumulate(pieces.begin(), pieces.end(), int64_t{0}), ", expected ", rows);
  if (rank < 0 || rank >= ranks) throw_error(what, ": rank ", rank, " is not in [0, ", ranks, ")");
  int64_t shard_rows = 0;
  for (size_t s = 0; s < pieces.size(); ++s)
    shard_rows += tp_shard_size(what, "segment " + std::to_string(s), pieces[s], ranks);
  Shape shape = full.shape();
  shape[0] = shard_rows;
  Tensor shard = Tensor::empty(shape, DType::F32, category);
  const float* src = full.f32();
  float* dst = shard.f32();
  int64_t offset = 0;
  for (int64_t piece : pieces) {
    const int64_t share = piece / ranks;
    dst = std::copy_n(src + (offset + rank * share) * cols, share * cols, dst);
    offset += piece;
  }
  return shard;
}

Tensor column_shard(const Tensor& full, int rank, int ranks, MemCategory category) {
  const std::string what = "column_shard of a " + shape_to_string(full.shape()) + " tensor";
  if (full.dim() != 2) throw_error(what, ": expected a 2-D [rows, columns] tensor");
  if (rank < 0 || rank >= ranks) throw_error(what, ": rank ", rank, " is not in [0, ", ranks, ")");
  const int64_t rows = full.size(0), cols = full.size(1);
  const int64_t share = tp_shard_size(what, "columns", cols, ranks);
  Tensor shard = Tensor::empty({rows, share}, DType::F32, category);
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(full.f32() + r * cols + rank * share, share, shard.f32() + r * share);
  return shard;
}

int64_t sequence_shard_rows(std::string_view layer, int64_t rows, int tp) {
  return tp_shard_size(std::string(layer) + " (sequence parallel)", "rows (batch x sequence)", rows,
                       tp);
}

WorkHandle gather_sequence_rows(ProcessGroup& tp, const float* local, float* full,
                                int64_t local_rows, int64_t width) {
  return tp.all_gather(local, full, local_rows * width);
}

WorkHandle reduce_scatter_sequence_rows(ProcessGroup& tp, const float* full, float* local,
                                        int64_t local_rows, int64_t width) {
  return tp.reduce_scatter(full, local, local_rows * width, ReduceOp::Sum);
}

void all_reduce_sequence_parallel_grads(const ParameterList& params, ProcessGroup& tp) {
  std::vector<WorkHandle> works;
  works.reserve(params.size());
  for (Parameter* p : params)
    works.push_back(tp.all_reduce(p->grad.f32(), p->grad.numel(), ReduceOp::Sum));
  for (WorkHandle& work : works) work->wait();
}

float* reserve_f32(Tensor& buffer, int64_t count, MemCategory category) {
  if (!buffer.defined() || buffer.numel() < count)
    buffer = Tensor::empty({std::max<int64_t>(count, 1)}, DType::F32, category);
  return buffer.f32();
}

}  // namespace loom
