#include "loom/model/tensor_shard.hpp"

#include <algorithm>
#include <numeric>

#include "loom/core/error.hpp"

namespace loom {

ShardRange shard_range(int64_t extent, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw_error("shard_range: rank ", rank, " is not in [0, ", ranks, ")");
  const int64_t block = (extent + ranks - 1) / ranks;
  const int64_t begin = std::min(extent, block * rank);
  return {begin, std::min(extent, begin + block) - begin};
}

Placement shard_placement(const Shape& full_shape, int axis, int rank, int ranks,
                          std::vector<int64_t> segments) {
  if (axis < 0 || axis >= static_cast<int>(full_shape.size()) || axis > 1)
    throw_error("shard_placement: axis ", axis, " of a ", shape_to_string(full_shape),
                " tensor (rows 0 or columns 1 only)");
  const int64_t extent = full_shape[static_cast<size_t>(axis)];
  if (segments.empty()) segments = {extent};
  if (std::accumulate(segments.begin(), segments.end(), int64_t{0}) != extent)
    throw_error("shard_placement: segments of a ", shape_to_string(full_shape), " tensor add up to ",
                std::accumulate(segments.begin(), segments.end(), int64_t{0}), ", expected ", extent);
  Placement p;
  p.replicated = ranks == 1;
  p.full_shape = full_shape;
  p.axis = axis;
  p.segments = std::move(segments);
  p.rank = rank;
  p.ranks = ranks;
  (void)shard_range(extent, rank, ranks);  // validates rank
  return p;
}

Shape shard_shape(const Placement& p) {
  if (p.replicated) return p.full_shape;
  Shape shape = p.full_shape;
  int64_t extent = 0;
  for (int64_t segment : p.segments) extent += shard_range(segment, p.rank, p.ranks).length;
  shape[static_cast<size_t>(p.axis)] = extent;
  return shape;
}

std::vector<ShardRun> shard_runs(const Placement& p) {
  if (p.replicated) return {{0, 0, shape_numel(p.full_shape)}};
  const Shape& full = p.full_shape;
  const int64_t rows = full.empty() ? 1 : full[0];
  const int64_t cols = full.size() < 2 ? 1 : shape_numel(full) / std::max<int64_t>(rows, 1);
  std::vector<ShardRun> runs;
  if (p.axis == 0) {
    int64_t full_row = 0, shard_row = 0;
    for (int64_t segment : p.segments) {
      const ShardRange r = shard_range(segment, p.rank, p.ranks);
      if (r.length > 0) runs.push_back({(full_row + r.begin) * cols, shard_row * cols, r.length * cols});
      full_row += segment;
      shard_row += r.length;
    }
    return runs;
  }
  int64_t shard_cols = 0;
  for (int64_t segment : p.segments) shard_cols += shard_range(segment, p.rank, p.ranks).length;
  for (int64_t row = 0; row < rows; ++row) {
    int64_t full_col = 0, shard_col = 0;
    for (int64_t segment : p.segments) {
      const ShardRange r = shard_range(segment, p.rank, p.ranks);
      if (r.length > 0)
        runs.push_back({row * cols + full_col + r.begin, row * shard_cols + shard_col, r.length});
      full_col += segment;
      shard_col += r.length;
    }
  }
  return runs;
}

namespace {
void check_shapes(const char* what, const Tensor& full, const Tensor& shard, const Placement& p) {
  if (full.shape() != p.full_shape || shard.shape() != shard_shape(p))
    throw_error(what, ": got a ", shape_to_string(full.shape()), " whole and a ",
                shape_to_string(shard.shape()), " shard, the placement says ",
                shape_to_string(p.full_shape), " and ", shape_to_string(shard_shape(p)));
}
}  // namespace

Tensor take_shard(const Tensor& full, const Placement& p, MemCategory category) {
  if (p.replicated) return full.clone(category);
  Tensor shard = Tensor::empty(shard_shape(p), DType::F32, category);
  check_shapes("take_shard", full, shard, p);
  const float* src = full.f32();
  float* dst = shard.f32();
  for (const ShardRun& run : shard_runs(p))
    std::copy_n(src + run.full_offset, run.count, dst + run.shard_offset);
  return shard;
}

void put_shard(Tensor& full, const Tensor& shard, const Placement& p) {
  if (p.replicated) {
    full.copy_from(shard);
    return;
  }
  check_shapes("put_shard", full, shard, p);
  const float* src = shard.f32();
  float* dst = full.f32();
  for (const ShardRun& run : shard_runs(p))
    std::copy_n(src + run.shard_offset, run.count, dst + run.full_offset);
}

}  // namespace loom
