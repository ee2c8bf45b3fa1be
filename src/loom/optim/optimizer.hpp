#pragma once
// The one optimizer interface the trainer drives. AdamW over a rank's whole parameters
// (optim/adamw) and ZeRO's sharded AdamW (parallel/zero_optimizer) both implement it, so the
// training loop, clipping and checkpoints never ask which one they hold.
#include <cstdint>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// What one rank owns of one parameter: elements [start, start + count) of its flattened value
// (loom layout), with 1-D views of `count` elements of each piece of state, on the device the
// state lives on (the value in the model's compute dtype, the rest F32). Over all ranks, every
// element of every parameter is owned exactly once.
struct OwnedSlice {
  const Parameter* param;
  Shape shape;
  int64_t start = 0, count = 0;
  Tensor value;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor master;  // undefined without master weights
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Under tensor and pipeline parallelism the parameters are this rank's shards of one stage:
  // the clipping norm sums sharded gradients' squares over `tp` (replicated ones count once)
  // and every stage's over `pp`. Either may be null (one rank on that axis).
  virtual void set_model_parallel_groups(std::shared_ptr<ProcessGroup> tp,
                                         std::shared_ptr<ProcessGroup> pp) = 0;
  // Under expert parallelism each rank of `ep` holds other experts; their squares are summed
  // over it in the clipping norm (Parameter::expert_sharded).
  virtual void set_expert_parallel_group(std::shared_ptr<ProcessGroup> ep) { (void)ep; }
  // Before a step's first micro-batch: gradients to zero (or, where they are sharded and
  // allocated on demand, released).
  virtual void zero_grad() = 0;
  // Whether the coming backward is the last before the step. An optimizer that reduces
  // gradients itself (ZeRO-1) waits for it; others ignore it.
  virtual void set_sync(bool sync) { (void)sync; }
  // A step in two halves, so that the trainer can look at the norm (and the loss) and agree
  // over every rank to drop a bad step before anything is updated:
  // Completes what is pending on the gradients (ZeRO's reduce-scatters) and returns the whole
  // model's global norm. Collective over the groups the gradients are spread over.
  virtual double finish_gradients() = 0;
  // After finish_gradients(): updates the parameters at learning rate `lr` with every gradient
  // scaled by `grad_multiplier` (a clipping factor) and counts one step.
  virtual void update(double lr, double grad_multiplier) = 0;
  // After finish_gradients(), instead of update(): the step's gradients are dropped. Weights,
  // moments, masters and the step count stay as they were; the gradients are cleared.
  virtual void skip_update() { zero_grad(); }
  // Both halves: clips to the global norm `max_norm` (<= 0: no clipping) and updates at `lr`.
  // Returns the norm before clipping.
  double step(double lr, double max_norm);
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;

  // Checkpoints: what this rank owns of every parameter and its state. Read them, or write
  // them and then call publish_parameters() so that every rank's parameters agree.
  virtual std::vector<OwnedSlice> owned_slices() = 0;
  virtual void publish_parameters() {}
  // Whether each data-parallel rank owns a different part of the state (every rank writes a
  // checkpoint shard) or every replica owns all of it (one replica writes).
  virtual bool shards_state_over_data_parallel() const { return false; }
};

}  // namespace loom
