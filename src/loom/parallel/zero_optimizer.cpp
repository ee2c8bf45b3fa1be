#include "loom/parallel/zero_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/adamw.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/gradient_buckets.hpp"
#include "loom/train/grad_clip.hpp"

namespace loom {

ZeroStage1Optimizer::ZeroStage1Optimizer(ParameterList params, std::shared_ptr<ProcessGroup> dp,
                                         int64_t bucket_bytes, AdamWConfig config)
    : dp_(std::move(dp)), config_(config) {
  const int64_t ranks = dp_->size(), rank = dp_->rank();
  BucketPlan plan = plan_gradient_buckets(params, bucket_bytes);
  for (BucketPlan::Bucket& planned : plan.buckets) {
    Bucket& bucket = buckets_.emplace_back();
    bucket.params = std::move(planned.params);
    bucket.offsets = std::move(planned.offsets);
    const int64_t elements = planned.elements;
    bucket.padded = (elements + ranks - 1) / ranks * ranks;
    bucket.shard = bucket.padded / ranks;
    bucket.flat = Tensor::zeros({bucket.padded}, DType::F32, MemCategory::CommBuffers);
    bucket.grad_shard = Tensor::zeros({bucket.shard}, DType::F32, MemCategory::Gradients);
    bucket.exp_avg = Tensor::zeros({bucket.shard}, DType::F32, MemCategory::OptimizerState);
    bucket.exp_avg_sq = Tensor::zeros({bucket.shard}, DType::F32, MemCategory::OptimizerState);
    const int64_t begin = rank * bucket.shard, end = begin + bucket.shard;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const int64_t p_begin = bucket.offsets[i], p_end = p_begin + bucket.params[i]->value.numel();
      const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
      if (lo < hi) bucket.segments.push_back({bucket.params[i], lo - p_begin, lo - begin, hi - lo});
    }
  }
  bucket_of_ = std::move(plan.bucket_of);
}

void ZeroStage1Optimizer::attach(Transformer& model) {
  model.set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
}

void ZeroStage1Optimizer::on_grad_ready(Parameter& param) {
  if (!sync_) return;
  auto it = bucket_of_.find(&param);
  if (it == bucket_of_.end()) throw_error("zero: parameter '", param.name, "' is not in any bucket");
  Bucket& bucket = buckets_[it->second];
  if (++bucket.ready == static_cast<int64_t>(bucket.params.size())) issue_reduce_scatter(bucket);
}

void ZeroStage1Optimizer::issue_reduce_scatter(Bucket& bucket) {
  float* flat = bucket.flat.f32();
  for (size_t i = 0; i < bucket.params.size(); ++i)
    std::memcpy(flat + bucket.offsets[i], bucket.params[i]->grad.f32(), bucket.params[i]->grad.nbytes());
  bucket.work = dp_->reduce_scatter(flat, bucket.grad_shard.f32(), bucket.shard, ReduceOp::Avg);
}

double ZeroStage1Optimizer::finish_and_step(double lr, double max_norm) {
  double local_sum_sq = 0.0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (!bucket.work)
      throw_error("zero: bucket ", b, " was never reduced: ", bucket.ready, " of ",
                  bucket.params.size(), " gradients reported ready");
    bucket.work->wait();
    bucket.work.reset();
    bucket.ready = 0;
    local_sum_sq += cpu::sum_of_squares(bucket.grad_shard.f32(), bucket.shard);
  }
  // The global norm from every rank's shard: one small all-reduce (f32 is enough for a norm).
  float sum_sq = static_cast<float>(local_sum_sq);
  dp_->all_reduce(&sum_sq, 1, ReduceOp::Sum)->wait();
  const double norm = std::sqrt(static_cast<double>(sum_sq));
  const double factor = clip_factor(norm, max_norm);
  ++step_;
  const int64_t rank = dp_->rank();
  for (Bucket& bucket : buckets_) {
    float* shard_params = bucket.flat.f32() + rank * bucket.shard;  // updated in place, then gathered
    for (const Segment& s : bucket.segments) {
      std::memcpy(shard_params + s.shard_offset, s.param->value.f32() + s.param_offset,
                  static_cast<size_t>(s.count) * sizeof(float));
      const cpu::AdamWStep step{static_cast<float>(lr), static_cast<float>(config_.beta1),
                                static_cast<float>(config_.beta2), static_cast<float>(config_.eps),
                                s.param->weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                                step_, static_cast<float>(factor)};
      cpu::adamw_update(shard_params + s.shard_offset, bucket.grad_shard.f32() + s.shard_offset,
                        bucket.exp_avg.f32() + s.shard_offset, bucket.exp_avg_sq.f32() + s.shard_offset,
                        s.count, step);
    }
    // all_gather may not read and write the same buffer: send a copy of the updated slice
    // (the gradient shard is spent by now).
    std::memcpy(bucket.grad_shard.f32(), shard_params, bucket.grad_shard.nbytes());
    bucket.work = dp_->all_gather(bucket.grad_shard.f32(), bucket.flat.f32(), bucket.shard);
  }
  for (Bucket& bucket : buckets_) {
    bucket.work->wait();
    bucket.work.reset();
    for (size_t i = 0; i < bucket.params.size(); ++i)
      std::memcpy(bucket.params[i]->value.f32(), bucket.flat.f32() + bucket.offsets[i],
                  bucket.params[i]->value.nbytes());
  }
  return norm;
}

std::vector<std::pair<std::string, Tensor>> ZeroStage1Optimizer::gather_full_state() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Bucket& bucket : buckets_) {
    for (const auto& [suffix, shard] : {std::pair<const char*, Tensor*>{".exp_avg", &bucket.exp_avg},
                                        std::pair<const char*, Tensor*>{".exp_avg_sq", &bucket.exp_avg_sq}}) {
      Tensor full = Tensor::empty({bucket.padded}, DType::F32, MemCategory::Workspace);
      dp_->all_gather(shard->f32(), full.f32(), bucket.shard)->wait();
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        Tensor t = Tensor::empty(bucket.params[i]->value.shape(), DType::F32, MemCategory::Workspace);
        std::memcpy(t.f32(), full.f32() + bucket.offsets[i], t.nbytes());
        out.emplace_back(bucket.params[i]->name + suffix, t);
      }
    }
  }
  return out;
}

void ZeroStage1Optimizer::load_full_state(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                          int64_t steps_taken) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  for (Bucket& bucket : buckets_) {
    for (const auto& [suffix, shard] : {std::pair<const char*, Tensor*>{".exp_avg", &bucket.exp_avg},
                                        std::pair<const char*, Tensor*>{".exp_avg_sq", &bucket.exp_avg_sq}}) {
      shard->zero_();
      for (const Segment& s : bucket.segments) {
        const std::string name = s.param->name + suffix;
        auto it = by_name.find(name);
        if (it == by_name.end()) throw_error("optimizer state: tensor '", name, "' is missing");
        if (it->second->numel() != s.param->value.numel())
          throw_error("optimizer state: tensor '", name, "' has ", it->second->numel(),
                      " elements, expected ", s.param->value.numel());
        const std::vector<float> values = it->second->to_f32_vector();
        std::memcpy(shard->f32() + s.shard_offset, values.data() + s.param_offset,
                    static_cast<size_t>(s.count) * sizeof(float));
      }
    }
  }
  step_ = steps_taken;
}

int64_t ZeroStage1Optimizer::shard_elements() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.shard;
  return n;
}

}  // namespace loom
