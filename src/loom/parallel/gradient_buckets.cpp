#include "loom/parallel/gradient_buckets.hpp"

#include "loom/core/error.hpp"

namespace loom {

BucketPlan plan_gradient_buckets(const ParameterList& params, int64_t bucket_bytes) {
  if (bucket_bytes <= 0)
    throw_error("parallel.bucket_mb: bucket of ", bucket_bytes, " bytes, expected > 0");
  BucketPlan plan;
  plan.buckets.emplace_back();
  for (Parameter* p : params) {
    BucketPlan::Bucket* bucket = &plan.buckets.back();
    const int64_t numel = p->value.numel();
    if (!bucket->params.empty() &&
        (bucket->elements + numel) * static_cast<int64_t>(sizeof(float)) > bucket_bytes)
      bucket = &plan.buckets.emplace_back();
    bucket->params.push_back(p);
    bucket->offsets.push_back(bucket->elements);
    bucket->elements += numel;
    plan.bucket_of[p] = plan.buckets.size() - 1;
  }
  return plan;
}

}  // namespace loom
