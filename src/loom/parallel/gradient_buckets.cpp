#include "loom/parallel/gradient_buckets.hpp"

#include "loom/core/error.hpp"

namespace loom {

std::vector<std::vector<size_t>> group_into_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes) {
  if (bucket_bytes <= 0)
    throw_error("parallel.bucket_mb: bucket of ", bucket_bytes, " bytes, expected > 0");
  std::vector<std::vector<size_t>> buckets(1);
  int64_t elements = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (!buckets.back().empty() && (elements + numels[i]) * static_cast<int64_t>(sizeof(float)) > bucket_bytes) {
      buckets.emplace_back();
      elements = 0;
    }
    buckets.back().push_back(i);
    elements += numels[i];
  }
  return buckets;
}

BucketPlan plan_gradient_buckets(const ParameterList& params, int64_t bucket_bytes) {
  std::vector<int64_t> numels;
  for (const Parameter* p : params) numels.push_back(p->value.numel());
  BucketPlan plan;
  for (const std::vector<size_t>& indices : group_into_buckets(numels, bucket_bytes)) {
    BucketPlan::Bucket& bucket = plan.buckets.emplace_back();
    for (size_t i : indices) {
      bucket.params.push_back(params[i]);
      bucket.offsets.push_back(bucket.elements);
      bucket.elements += numels[i];
      plan.bucket_of[params[i]] = plan.buckets.size() - 1;
    }
  }
  return plan;
}

}  // namespace loom
