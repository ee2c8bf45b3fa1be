#pragma once
// AdamW on the device over a GpuParameterSet, the twin of loom::AdamW: the same per-parameter
// step arguments (weight decay for 2-D weights only, clipping folded into grad_multiplier),
// moments in f32, updates applied to the fp32 masters; under bf16 the same kernel pass also
// writes each updated master's bf16 working copy. Checkpoint state is exchanged as host tensors
// named as loom::AdamW::state_tensors names them, so checkpoints move between CPU and GPU runs.
#include "loom/gpu/device_buffer.hpp"
#include "loom/gpu/gpu_parameters.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::gpu {

class GpuAdamW {
 public:
  GpuAdamW(GpuParameterSet& params, AdamWConfig config);
  // grad_multiplier scales every gradient as it is read (global-norm clipping).
  void step(double lr, double grad_multiplier = 1.0);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }

  // Host copies: "<param>.exp_avg", "<param>.exp_avg_sq", and under bf16 "<param>.master"
  // (the fp32 masters, which the model's host values only hold rounded to bf16).
  NamedTensors state_tensors() const;
  // Uploads the tensors state_tensors() names (missing or misshapen ones are an error naming
  // them); under bf16 the masters too, and their working copies are refreshed.
  void load_state(const NamedTensors& tensors);

 private:
  GpuParameterSet& params_;
  AdamWConfig config_;
  DeviceBuffer exp_avg_, exp_avg_sq_;  // laid out like the parameters' flat buffers
  int64_t step_ = 0;
};

}  // namespace loom::gpu
