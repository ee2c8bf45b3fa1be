#pragma once
// Cutting a tensor-parallel shard out of a whole tensor and pasting it back, by the rule
// Placement documents (model/parameter.hpp). The same rule serves initialisation (every rank
// draws the whole tensor and keeps its shard, so any tp computes the model one process does),
// checkpoints (shards are pasted into whole tensors, so a checkpoint does not depend on tp)
// and the tensor-parallel layers' load_full.
#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// [begin, begin + length) of an extent split into `ranks` blocks of ceil(extent / ranks).
struct ShardRange {
  int64_t begin = 0, length = 0;
};
ShardRange shard_range(int64_t extent, int rank, int ranks);

// A placement for rank `rank` of `ranks`, cutting `full_shape` along `axis` by `segments`.
Placement shard_placement(const Shape& full_shape, int axis, int rank, int ranks,
                          std::vector<int64_t> segments = {});
// The shape of the shard a placement describes (the full shape when replicated).
Shape shard_shape(const Placement& placement);

// The shard as runs of consecutive elements both tensors share (flattened row-major): one
// run per segment for a row shard, one per row and segment for a column shard.
struct ShardRun {
  int64_t full_offset = 0, shard_offset = 0, count = 0;
};
std::vector<ShardRun> shard_runs(const Placement& placement);

// The shard of `full` (shape placement.full_shape) that `placement` names, as a new tensor.
Tensor take_shard(const Tensor& full, const Placement& placement,
                  MemCategory category = MemCategory::Workspace);
// Writes `shard` into its place in `full`.
void put_shard(Tensor& full, const Tensor& shard, const Placement& placement);

}  // namespace loom
