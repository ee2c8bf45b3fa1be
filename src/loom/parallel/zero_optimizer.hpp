#pragma once
// ZeRO stage 1 (Rajbhandari et al., SC'20, sec. 5.1): AdamW's moments are sharded over the dp
// group. Gradients are packed into buckets in backward order; when a bucket is complete its
// reduce-scatter starts, leaving each rank the averaged gradient of its 1/N slice of the
// bucket. Each rank updates only its slice, and an all-gather per bucket returns the updated
// parameters to every rank. Wire bytes equal one all-reduce ((N-1)/N reduce-scatter plus
// (N-1)/N all-gather); optimizer-state memory drops to 1/N (buckets padded to a multiple of N).
#include <memory>
#include <unordered_map>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"
#include "loom/train/adamw.hpp"

namespace loom {

class Transformer;

class ZeroStage1Optimizer {
 public:
  ZeroStage1Optimizer(ParameterList params_in_ready_order, std::shared_ptr<ProcessGroup> dp,
                      int64_t bucket_bytes, AdamWConfig config);
  void attach(Transformer& model);
  void set_sync(bool sync) { sync_ = sync; }
  void on_grad_ready(Parameter& param);
  // Waits for the gradient shards, clips by the global norm (max_norm <= 0: off), updates the
  // local shard and all-gathers the parameters. Returns the gradient norm before clipping.
  double finish_and_step(double lr, double max_norm);

  int64_t steps_taken() const { return step_; }
  // Full (unsharded) moments named as AdamW names them, gathered from all ranks, so a ZeRO-1
  // checkpoint is the same file as a single-process one and loads on any layout.
  std::vector<std::pair<std::string, Tensor>> gather_full_state();
  // Takes this rank's slices of full moments (as AdamW::state_tensors names them).
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps_taken);
  int64_t shard_elements() const;  // moments held by this rank, each

 private:
  struct Segment {  // the part of one parameter inside this rank's slice of a bucket
    Parameter* param;
    int64_t param_offset, shard_offset, count;
  };
  struct Bucket {
    std::vector<Parameter*> params;
    std::vector<int64_t> offsets;
    int64_t padded = 0, shard = 0;  // elements: whole bucket (multiple of N), per rank
    Tensor flat;                    // packed gradients, then packed parameters (CommBuffers)
    Tensor grad_shard;              // this rank's averaged gradient slice (Gradients)
    Tensor exp_avg, exp_avg_sq;     // this rank's moments (OptimizerState)
    std::vector<Segment> segments;
    int64_t ready = 0;
    WorkHandle work;
  };
  void issue_reduce_scatter(Bucket& bucket);

  std::shared_ptr<ProcessGroup> dp_;
  AdamWConfig config_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  bool sync_ = true;
  int64_t step_ = 0;
};

}  // namespace loom
