#include "loom/parallel/tensor_parallel.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/model/tensor_shard.hpp"

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
  const int64_t rows = full.size(0);
  const std::string what = "row_shard of a " + shape_to_string(full.shape()) + " tensor";
  const std::vector<int64_t> pieces = segments.empty() ? std::vector<int64_t>{rows} : segments;
  if (std::accumulate(pieces.begin(), pieces.end(), int64_t{0}) != rows)
    throw_error(what, ": its segments add up to ",
                std::accumulate(pieces.begin(), pieces.end(), int64_t{0}), ", expected ", rows);
  if (rank < 0 || rank >= ranks) throw_error(what, ": rank ", rank, " is not in [0, ", ranks, ")");
  for (size_t s = 0; s < pieces.size(); ++s)
    (void)tp_shard_size(what, "segment " + std::to_string(s), pieces[s], ranks);
  return take_shard(full, shard_placement(full.shape(), 0, rank, ranks, pieces), category);
}

Tensor column_shard(const Tensor& full, int rank, int ranks, MemCategory category) {
  const std::string what = "column_shard of a " + shape_to_string(full.shape()) + " tensor";
  if (full.dim() != 2) throw_error(what, ": expected a 2-D [rows, columns] tensor");
  if (rank < 0 || rank >= ranks) throw_error(what, ": rank ", rank, " is not in [0, ", ranks, ")");
  (void)tp_shard_size(what, "columns", full.size(1), ranks);
  return take_shard(full, shard_placement(full.shape(), 1, rank, ranks), category);
}

int64_t sequence_shard_rows(std::string_view layer, int64_t rows, int tp) {
  return tp_shard_size(std::string(layer) + " (sequence parallel)", "rows (batch x sequence)", rows,
                       tp);
}

WorkHandle gather_sequence_rows(ProcessGroup& tp, const Tensor& local, const Tensor& full) {
  return comm::all_gather(tp, local, full);
}

WorkHandle reduce_scatter_sequence_rows(ProcessGroup& tp, const Tensor& full, const Tensor& local) {
  return comm::reduce_scatter(tp, full, local, ReduceOp::Sum);
}

void all_reduce_sequence_parallel_grads(const ParameterList& params, ProcessGroup& tp) {
  std::vector<WorkHandle> works;
  works.reserve(params.size());
  for (Parameter* p : params) works.push_back(comm::all_reduce(tp, p->grad, ReduceOp::Sum));
  for (WorkHandle& work : works) work->wait();
}

Tensor reserve_like(Tensor& buffer, int64_t rows, int64_t width, const Tensor& like,
                    MemCategory category) {
  const int64_t count = rows * width;
  if (!buffer.defined() || buffer.numel() < count || buffer.dtype() != like.dtype() ||
      buffer.device() != like.device())
    buffer = Tensor::empty({std::max<int64_t>(count, 1)}, like.dtype(), category, like.device());
  return buffer.slice_as(0, {rows, width});
}

}  // namespace loom
