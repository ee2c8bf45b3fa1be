#include "loom/optim/adamw.hpp"

#include <map>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/optim/grad_clip.hpp"

namespace loom {

AdamW::AdamW(ParameterList params, AdamWConfig config, bool master_weights)
    : params_(std::move(params)), config_(config) {
  // bf16 working weights (CUDA) need f32 masters whatever was asked.
  for (const Parameter* p : params_) master_weights = master_weights || p->value.dtype() != DType::F32;
  for (Parameter* p : params_) {
    const Device device = p->value.device();
    exp_avg_.push_back(Tensor::zeros(p->value.shape(), DType::F32, MemCategory::OptimizerState, device));
    exp_avg_sq_.push_back(Tensor::zeros(p->value.shape(), DType::F32, MemCategory::OptimizerState, device));
    if (master_weights) {
      Tensor master = Tensor::empty(p->value.shape(), DType::F32, MemCategory::OptimizerState, device);
      master.copy_from(p->value);
      master_.push_back(master);
      ops::round_to_bf16_(p->value);  // an f32 value now holds bf16 values; a bf16 one already does
    }
  }
}

void AdamW::zero_grad() {
  for (Parameter* p : params_) p->grad.zero_();
}

double AdamW::finish_gradients() { return global_grad_norm(params_, {tp_.get(), pp_.get(), ep_.get()}); }

void AdamW::update(double lr, double grad_multiplier) {
  ++step_;
  // Every parameter in one call: a single kernel launch on a GPU, the per-tensor op in turn on
  // the CPU.
  std::vector<ops::AdamWTensors> tensors;
  tensors.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const ops::AdamWStep s{static_cast<float>(lr), static_cast<float>(config_.beta1),
                           static_cast<float>(config_.beta2), static_cast<float>(config_.eps),
                           p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f, step_,
                           static_cast<float>(grad_multiplier)};
    if (master_.empty())
      tensors.push_back({p.value, Tensor(), p.grad, exp_avg_[i], exp_avg_sq_[i], s});
    else
      tensors.push_back({master_[i], p.value, p.grad, exp_avg_[i], exp_avg_sq_[i], s});
  }
  ops::adamw_update_many(tensors);
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i]->name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i]->name + ".exp_avg_sq", exp_avg_sq_[i]);
    if (!master_.empty()) out.emplace_back(params_[i]->name + ".master", master_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors,
                       int64_t steps_taken) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  for (const auto& [name, mine] : state_tensors()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw_error("optimizer state: tensor '", name, "' is missing");
    if (it->second->shape() != mine.shape())
      throw_error("optimizer state: tensor '", name, "' has shape ",
                  shape_to_string(it->second->shape()), ", expected ", shape_to_string(mine.shape()));
    Tensor target = mine;  // shares storage with our state
    target.copy_from(*it->second);
  }
  step_ = steps_taken;
}

std::vector<OwnedSlice> AdamW::owned_slices() {
  std::vector<OwnedSlice> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const Shape flat{p.value.numel()};
    out.push_back({&p, p.value.shape(), 0, p.value.numel(), p.value.view(flat), exp_avg_[i].view(flat),
                   exp_avg_sq_[i].view(flat), master_.empty() ? Tensor() : master_[i].view(flat)});
  }
  return out;
}

}  // namespace loom
