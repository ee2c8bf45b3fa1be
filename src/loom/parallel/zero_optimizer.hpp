#pragma once
// ZeRO (Rajbhandari et al., SC'20, sec. 5) over the dp group, stages 1 to 3, with AdamW.
//
// Parameters are laid over flat buffers ("flats"), padded to a multiple of the dp size N so
// that rank r owns elements [r*shard, (r+1)*shard) of each. Stages 1-2 use size-capped
// buckets in gradient-ready order (as plain data parallelism does); stage 3 uses one flat per
// model unit (Transformer::unit_parameters), the granularity at which it gathers parameters.
//   stage 1: moments (and fp32 masters) sharded. Gradients accumulate locally in full; the
//            last micro-batch reduce-scatters each bucket as soon as it is complete.
//   stage 2: gradients sharded too: every micro-batch reduce-scatters each bucket as it
//            completes and adds the result to the rank's gradient shard; the full-size
//            gradient buffer lives only from the unit's backward until its reduce-scatter ends.
//            At most one reduce-scatter stays in flight past the start of the next unit's
//            backward; the older ones are finished and their buffers freed there (and only
//            there, so the peak is the same every step: plan/memory_model's replay of it).
//   stage 3: parameters sharded too: a unit's parameters are all-gathered just before its
//            forward and again before its backward (the next unit's gather is issued ahead,
//            so it overlaps compute) and freed after each use. Under expert parallelism a
//            unit's experts are a flat of their own over the ranks that hold them.
// Stages 1-2 all-gather updated parameter shards after the step; stage 3 does not (its
// parameters are the shards). Per step wire bytes: stages 1-2 equal one all-reduce of the
// gradients (a reduce-scatter plus an all-gather); stage 3 adds one more parameter all-gather
// (forward and backward each gather; the root unit is gathered once and kept across both).
#include <memory>
#include <unordered_map>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optimizer.hpp"

namespace loom {

class Transformer;

struct ZeroConfig {
  int stage = 1;
  int64_t bucket_bytes = 25 * 1000 * 1000;  // stages 1-2
  bool master_weights = false;              // bf16: fp32 master shards, bf16-rounded parameters
};

class ZeroOptimizer final : public Optimizer {
 public:
  // Takes over the model's parameter and gradient storage and installs its hooks on `model`,
  // which must outlive this object. Under expert parallelism `experts` is the
  // expert-data-parallel group: the experts' flats (Parameter::expert_sharded) shard over it,
  // and their gradients, summed there over every ep rank's tokens, are scaled to dp's mean.
  // Stage 3 then gives each unit two flats, its dense parameters' over dp and its experts'
  // over `experts`, gathered, released and prefetched together.
  ZeroOptimizer(Transformer& model, std::shared_ptr<ProcessGroup> dp, ZeroConfig zero, AdamWConfig adamw,
                std::shared_ptr<ProcessGroup> experts = nullptr);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return zero_.stage; }
  // Under tensor and pipeline parallelism the model holds this rank's shards of one stage:
  // the clipping norm then sums the sharded gradients' squares over `tp` (replicated ones
  // count once) and every stage's over `pp` (grad_clip's global_grad_norm). Either may be null.
  void set_model_parallel_groups(std::shared_ptr<ProcessGroup> tp, std::shared_ptr<ProcessGroup> pp) override {
    tp_ = std::move(tp);
    pp_ = std::move(pp);
  }
  // Stage 1 only: false for all but the last micro-batch (gradients accumulate locally).
  // Stages 2-3 reduce every micro-batch, which is what keeps their gradients sharded.
  void set_sync(bool sync) override { sync_ = sync; }
  void zero_grad() override;
  // Waits for the gradient shards and returns the global norm from every rank's shard.
  double finish_gradients() override;
  // Updates the local shard and (stages 1-2) all-gathers the parameters.
  void update(double lr, double grad_multiplier) override;
  // Nothing is updated or gathered; stage 3 releases what is still gathered, as after a step.
  void skip_update() override;
  int64_t steps_taken() const override { return step_; }

  // Checkpoints: read or write state through these pointers, then call publish_parameters()
  // so that every rank's parameters agree with the written shards.
  std::vector<OwnedSlice> owned_slices() override;
  void set_steps_taken(int64_t steps) override { step_ = steps; }
  void publish_parameters() override;
  bool shards_state_over_data_parallel() const override { return true; }
  // Stage 3: gathers every unit so that each parameter holds its full value (collective; the
  // next forward frees them again). Stages 1-2: nothing to do.
  void materialize_parameters();

  // Sizes, for memory and communication checks: elements of each flat, padded, and per rank.
  struct FlatSize {
    int64_t elements, padded, shard;
    bool root_unit;  // stage 3: the unit gathered once per step instead of twice
  };
  std::vector<FlatSize> flat_sizes() const;

 private:
  struct Segment {  // the part of one parameter inside this rank's slice of a flat
    size_t param_index;
    int64_t param_offset, shard_offset, count;
  };
  enum class GatherState { Released, InFlight, Ready };
  struct Flat {
    ProcessGroup* group = nullptr;  // dp, or the expert-data-parallel group for experts' flats
    float grad_scale = 1.0f;        // applied to the reduced gradients (experts: 1 / ep)
    std::vector<Parameter*> params;
    std::vector<Shape> shapes;
    std::vector<int64_t> offsets;
    int64_t elements = 0, padded = 0, shard = 0;
    int64_t unit = -1;  // stage 3
    std::vector<Segment> segments;
    Tensor param_full;   // stages 1-2 always; stage 3 only while gathered (Parameters)
    Tensor param_shard;  // stage 3 (Parameters)
    Tensor master;       // fp32 masters of this rank's slice (OptimizerState), bf16 only
    Tensor exp_avg, exp_avg_sq;  // OptimizerState, one shard each
    Tensor grad_full;    // stage 1 always; stages 2-3 from first write to reduce-scatter end
    Tensor reduced;      // reduce-scatter output (CommBuffers)
    Tensor grad_shard;   // stages 2-3: accumulated over micro-batches (Gradients)
    Tensor send;         // all-gather input for stages 1-2 (CommBuffers)
    bool reduced_this_step = false;  // a reduce-scatter of this step's gradients completed
    int64_t ready = 0;
    WorkHandle reduce_work, gather_work;
    GatherState gather = GatherState::Released;
  };

  std::shared_ptr<ProcessGroup> tp_, pp_;
  void build_flats();
  Tensor shard_value(Flat& flat);  // this rank's slice of the parameter values
  Tensor shard_grad(Flat& flat);
  Device device() const;           // where the model, and so every flat, lives
  DType working_dtype() const;     // the values' dtype: F32, or BF16 on a bf16 CUDA model
  void on_grad_ready(Parameter& param);
  void allocate_grads(Flat& flat);
  void issue_reduce(Flat& flat);
  void complete_reduce(Flat& flat);
  void poll_reduces();
  void retire_reduces();  // finishes all but the latest reduce-scatter in flight
  void issue_gather(Flat& flat);
  void ensure_gathered(Flat& flat);
  void release(Flat& flat);
  void gather_unit(int64_t unit);  // every flat of the unit, waited for
  void release_unit(int64_t unit);
  void prefetch_unit(int64_t unit);
  void install_hooks();

  Transformer& model_;
  std::shared_ptr<ProcessGroup> dp_, experts_;
  ZeroConfig zero_;
  AdamWConfig adamw_;
  std::vector<Flat> flats_;
  std::unordered_map<const Parameter*, size_t> flat_of_;
  std::vector<std::vector<size_t>> flats_of_unit_;  // which flats hold each unit's parameters
  std::vector<size_t> in_flight_;  // stages 2-3: flats whose reduce-scatter was issued, oldest first
  bool sync_ = true;
  int64_t step_ = 0;
};

}  // namespace loom
