#include "loom/parallel/data_parallel.hpp"

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/gradient_buckets.hpp"
#include "loom/obs/trace.hpp"

namespace loom {

GradientBucketReducer::GradientBucketReducer(ParameterList params,
                                             std::shared_ptr<ProcessGroup> group,
                                             int64_t bucket_bytes,
                                             std::shared_ptr<ProcessGroup> experts)
    : params_(std::move(params)), group_(std::move(group)), experts_(std::move(experts)) {
  ParameterList dense, expert;
  for (Parameter* p : params_) (experts_ && p->expert_sharded ? expert : dense).push_back(p);
  for (const ParameterList* list : {&dense, &expert}) {
    if (list->empty()) continue;
    const bool is_expert = list == &expert;
    BucketPlan plan = plan_gradient_buckets(*list, bucket_bytes);
    const size_t first = buckets_.size();
    for (BucketPlan::Bucket& planned : plan.buckets) {
      Bucket& bucket = buckets_.emplace_back();
      bucket.group = is_expert ? experts_.get() : group_.get();
      bucket.expert = is_expert;
      bucket.params = std::move(planned.params);
      bucket.offsets = std::move(planned.offsets);
      // In the group's memory (host for MPI, the GPU for NCCL), so the collective takes it as is.
      bucket.flat = Tensor::empty({planned.elements}, DType::F32, MemCategory::CommBuffers,
                                  bucket.group->memory());
    }
    for (const auto& [param, index] : plan.bucket_of) bucket_of_[param] = first + index;
  }
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
  // Gradients are copied into the bucket here, after the kernels that wrote them (the copy
  // waits for them), and back in finish(), whichever devices the two live on.
  for (size_t i = 0; i < bucket.params.size(); ++i) {
    const Tensor& grad = bucket.params[i]->grad;
    bucket.flat.slice_as(bucket.offsets[i], {grad.numel()}).copy_from(grad);
  }
  timings_[index].params_ready_before_issue = ready_count_;
  timings_[index].issued_s = TraceRecorder::now_s();
  bucket.work = comm::all_reduce(*bucket.group, bucket.flat, bucket.expert ? ReduceOp::Sum : ReduceOp::Avg);
}

int64_t GradientBucketReducer::expected_all_reduce_wire_bytes() const {
  int64_t total = 0;
  for (const Bucket& bucket : buckets_)
    total += ring_all_reduce_wire_bytes(static_cast<int64_t>(bucket.flat.nbytes()), bucket.group->size()).sent;
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
    if (bucket.expert) ops::scale_(bucket.flat, 1.0f / static_cast<float>(group_->size()));
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const Tensor& grad = bucket.params[i]->grad;
      grad.copy_from(bucket.flat.slice_as(bucket.offsets[i], {grad.numel()}));
    }
    bucket.work.reset();
    bucket.ready = 0;
  }
  ready_count_ = 0;
}

}  // namespace loom
