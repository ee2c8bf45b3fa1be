#pragma once
// AdamW over a model's parameters, with weight-decay groups (decay 2-D weights; not norms or
// biases) and optional fp32 master weights for mixed precision.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// What one rank owns of one parameter: elements [start, start + count) of its flattened value
// (loom layout), with pointers to those elements of each piece of state. Over all ranks,
// every element of every parameter is owned exactly once.
struct OwnedSlice {
  const Parameter* param;
  Shape shape;
  int64_t start = 0, count = 0;
  float* value = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* master = nullptr;  // null without master weights
};

class AdamW {
 public:
  // With `master_weights`, the optimizer keeps an fp32 copy of every parameter, updates that,
  // and writes the bf16-rounded result back to the model (mixed precision).
  AdamW(ParameterList params, AdamWConfig config, bool master_weights = false);
  // grad_multiplier scales every gradient as it is read (global-norm clipping).
  void step(double lr, double grad_multiplier = 1.0);
  int64_t steps_taken() const { return step_; }

  // Named state for checkpoints: "<param>.exp_avg", "<param>.exp_avg_sq" (+ ".master").
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps_taken);
  // The whole of every parameter (one process owns everything), for checkpoints.
  std::vector<OwnedSlice> owned_slices();
  void set_steps_taken(int64_t steps) { step_ = steps; }
  const AdamWConfig& config() const { return config_; }

 private:
  ParameterList params_;
  AdamWConfig config_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_, master_;
  int64_t step_ = 0;
};

}  // namespace loom
