#include "loom/parallel/data_parallel.hpp"

#include <cstring>

#include "loom/core/error.hpp"
#include "loom/model/transformer.hpp"
#include "loom/obs/trace.hpp"

namespace loom {

GradientBucketReducer::GradientBucketReducer(ParameterList params,
                                             std::shared_ptr<ProcessGroup> group,
                                             int64_t bucket_bytes)
    : params_(std::move(params)), group_(std::move(group)) {
  if (bucket_bytes <= 0) throw_error("dp bucket size: got ", bucket_bytes, " bytes, expected > 0");
  std::vector<Bucket> buckets(1);
  int64_t bytes = 0;
  for (Parameter* p : params_) {
    const int64_t p_bytes = p->grad.numel() * static_cast<int64_t>(sizeof(float));
    if (!buckets.back().params.empty() && bytes + p_bytes > bucket_bytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().params.push_back(p);
    bytes += p_bytes;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    int64_t elements = 0;
    for (Parameter* p : bucket.params) {
      bucket.offsets.push_back(elements);
      elements += p->grad.numel();
      bucket_of_[p] = b;
    }
    bucket.flat = Tensor::empty({elements}, DType::F32, MemCategory::CommBuffers);
  }
  buckets_ = std::move(buckets);
  timings_.resize(buckets_.size());
}

void GradientBucketReducer::attach(Transformer& model) {
  model.set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
}

void GradientBucketReducer::on_grad_ready(Parameter& param) {
  if (!sync_) return;
  auto it = bucket_of_.find(&param);
  if (it == bucket_of_.end()) throw_error("dp: parameter '", param.name, "' is not in any gradient bucket");
  ++ready_count_;
  Bucket& bucket = buckets_[it->second];
  if (++bucket.ready == static_cast<int64_t>(bucket.params.size())) issue(it->second);
}

void GradientBucketReducer::issue(size_t index) {
  Bucket& bucket = buckets_[index];
  float* flat = bucket.flat.f32();
  for (size_t i = 0; i < bucket.params.size(); ++i)
    std::memcpy(flat + bucket.offsets[i], bucket.params[i]->grad.f32(),
                bucket.params[i]->grad.nbytes());
  timings_[index].params_ready_before_issue = ready_count_;
  timings_[index].issued_s = TraceRecorder::now_s();
  bucket.work = group_->all_reduce(flat, bucket.flat.numel(), ReduceOp::Avg);
}

int64_t GradientBucketReducer::expected_all_reduce_wire_bytes() const {
  int64_t total = 0;
  for (const Bucket& bucket : buckets_)
    total += ring_all_reduce_wire_bytes(static_cast<int64_t>(bucket.flat.nbytes()), group_->size()).sent;
  return total;
}

void GradientBucketReducer::finish() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.work) {
      throw_error("dp: bucket ", b, " was never reduced: ", bucket.ready, " of ",
                  bucket.params.size(), " gradients reported ready (first: '",
                  bucket.params.front()->name, "')");
    }
    bucket.work->wait();
    timings_[b].finished_s = TraceRecorder::now_s();
    const float* flat = bucket.flat.f32();
    for (size_t i = 0; i < bucket.params.size(); ++i)
      std::memcpy(bucket.params[i]->grad.f32(), flat + bucket.offsets[i],
                  bucket.params[i]->grad.nbytes());
    bucket.work.reset();
    bucket.ready = 0;
  }
  ready_count_ = 0;
}

}  // namespace loom
