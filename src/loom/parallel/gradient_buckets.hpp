#pragma once
// How parameters are grouped into communication buckets, shared by plain data parallelism and
// ZeRO: consecutive parameters (in gradient-ready order) fill a bucket up to `bucket_bytes`;
// a parameter larger than that gets a bucket of its own. Offsets are element offsets of each
// parameter in the bucket's packed buffer.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "loom/model/parameter.hpp"

namespace loom {

struct BucketPlan {
  struct Bucket {
    std::vector<Parameter*> params;
    std::vector<int64_t> offsets;
    int64_t elements = 0;
  };
  std::vector<Bucket> buckets;
  std::unordered_map<const Parameter*, size_t> bucket_of;
};

// Throws loom::Error for a non-positive bucket size.
BucketPlan plan_gradient_buckets(const ParameterList& params_in_ready_order, int64_t bucket_bytes);

// The same grouping on element counts alone (f32 gradients): indices into `numels` per
// bucket. The planner sizes buckets of models it never allocates with this.
std::vector<std::vector<size_t>> group_into_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes);

}  // namespace loom
