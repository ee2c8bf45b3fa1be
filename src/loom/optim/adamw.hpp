#pragma once
// AdamW over a model's parameters, with weight-decay groups (decay 2-D weights; not norms or
// biases) and optional fp32 master weights for mixed precision.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/model/parameter.hpp"
#include "loom/optim/optimizer.hpp"

namespace loom {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// AdamW over every parameter this rank holds (one process, or one replica under plain data
// parallelism, whose gradients the reducer has already averaged).
class AdamW final : public Optimizer {
 public:
  // With `master_weights`, the optimizer keeps an fp32 copy of every parameter, updates that,
  // and writes the bf16-rounded result back to the model (mixed precision).
  AdamW(ParameterList params, AdamWConfig config, bool master_weights = false);

  void set_model_parallel_groups(std::shared_ptr<ProcessGroup> tp, std::shared_ptr<ProcessGroup> pp) override {
    tp_ = std::move(tp);
    pp_ = std::move(pp);
  }
  void set_expert_parallel_group(std::shared_ptr<ProcessGroup> ep) override { ep_ = std::move(ep); }
  void zero_grad() override;
  // The global norm over this rank's parameters and the model-parallel groups.
  double finish_gradients() override;
  // The update alone: grad_multiplier scales every gradient as it is read (a clipping factor
  // computed by the caller).
  void update(double lr, double grad_multiplier = 1.0) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }

  // Named state for checkpoints: "<param>.exp_avg", "<param>.exp_avg_sq" (+ ".master").
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps_taken);
  // The whole of every parameter (one process owns everything), for checkpoints.
  std::vector<OwnedSlice> owned_slices() override;
  const AdamWConfig& config() const { return config_; }

 private:
  ParameterList params_;
  AdamWConfig config_;
  std::shared_ptr<ProcessGroup> tp_, pp_, ep_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_, master_;
  int64_t step_ = 0;
};

}  // namespace loom
