#pragma once
// Data parallelism without sharding (ZeRO stage 0): every rank holds the whole model, and
// gradients are averaged over the dp group. Gradients are packed into buckets in the order
// backward produces them; a bucket's all-reduce starts the moment its last gradient is ready,
// so communication overlaps the rest of backward (PyTorch DDP: Li et al., VLDB 2020, sec. 3.2).
// With gradient accumulation only the last micro-batch communicates (set_sync).
#include <memory>
#include <unordered_map>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

class Transformer;

// 25 MB, PyTorch DDP's default bucket_cap_mb: large enough to amortise per-call latency,
// small enough that the first bucket is ready early in backward.
constexpr int64_t kDefaultBucketBytes = 25 * 1000 * 1000;

struct BucketTiming {
  int64_t params_ready_before_issue = 0;  // how many gradients backward had produced by then
  double issued_s = 0, finished_s = 0;    // steady-clock seconds (TraceRecorder::now_s)
};

class GradientBucketReducer {
 public:
  // `params` in the order their gradients become ready (Transformer::parameters_in_grad_ready_order).
  // Under expert parallelism `experts` is the expert-data-parallel group: the experts'
  // gradients (Parameter::expert_sharded) are bucketed apart and summed over it, then divided
  // by `group`'s size, which gives the mean over every replica's tokens, since an expert's
  // gradient already holds every ep rank's tokens routed to it.
  GradientBucketReducer(ParameterList params, std::shared_ptr<ProcessGroup> group,
                        int64_t bucket_bytes = kDefaultBucketBytes,
                        std::shared_ptr<ProcessGroup> experts = nullptr);
  // Installs the gradient-ready hook on the model.
  void attach(Transformer& model);
  // false for all but the last micro-batch of a step: gradients then just accumulate locally.
  void set_sync(bool sync) { sync_ = sync; }
  void on_grad_ready(Parameter& param);
  // Waits for every bucket and writes the averaged gradients back. Throws if a parameter never
  // reported a gradient (its bucket could not have been reduced).
  void finish();

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  int64_t parameter_count() const { return static_cast<int64_t>(params_.size()); }
  const std::vector<BucketTiming>& last_timings() const { return timings_; }
  // Bytes one step's bucket all-reduces put on the wire per rank (ring algorithm).
  int64_t expected_all_reduce_wire_bytes() const;

 private:
  struct Bucket {
    ProcessGroup* group = nullptr;
    bool expert = false;  // summed over the expert group, then divided by group_'s size
    std::vector<Parameter*> params;
    std::vector<int64_t> offsets;  // element offset of each parameter in `flat`
    Tensor flat;                   // CommBuffers: the packed gradients
    int64_t ready = 0;
    WorkHandle work;
  };
  void issue(size_t bucket_index);

  ParameterList params_;
  std::shared_ptr<ProcessGroup> group_, experts_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  std::vector<BucketTiming> timings_;
  int64_t ready_count_ = 0;
  bool sync_ = true;
};

}  // namespace loom
