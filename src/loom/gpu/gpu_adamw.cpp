#include "loom/gpu/gpu_adamw.hpp"

#include <map>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/adamw.hpp"

namespace loom::gpu {

namespace {
bool has_masters_in_state(const GpuParameterSet& params) {
  return params.compute_dtype() == DType::BF16;
}
}  // namespace

GpuAdamW::GpuAdamW(GpuParameterSet& params, AdamWConfig config)
    : params_(params),
      config_(config),
      exp_avg_(DeviceBuffer::of<float>(params.padded_elements(), MemCategory::OptimizerState)),
      exp_avg_sq_(DeviceBuffer::of<float>(params.padded_elements(), MemCategory::OptimizerState)) {
  exp_avg_.zero();
  exp_avg_sq_.zero();
}

void GpuAdamW::step(double lr, double grad_multiplier) {
  ++step_;
  for (GpuParameter& p : params_.all()) {
    // The same f32 arguments loom::AdamW::step gives the CPU kernel.
    const cuda::AdamWStep s{static_cast<float>(lr),
                            static_cast<float>(config_.beta1),
                            static_cast<float>(config_.beta2),
                            static_cast<float>(config_.eps),
                            p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f,
                            step_,
                            static_cast<float>(grad_multiplier)};
    float* m = exp_avg_.as<float>() + p.offset;
    float* v = exp_avg_sq_.as<float>() + p.offset;
    if (p.working)
      cuda::adamw_update(p.master, p.working, p.grad, m, v, p.numel, s);
    else
      cuda::adamw_update(p.master, p.grad, m, v, p.numel, s);
  }
}

NamedTensors GpuAdamW::state_tensors() const {
  NamedTensors out;
  auto download = [](const float* device, const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32, MemCategory::OptimizerState);
    copy_to_host(t.f32(), device, t.nbytes());
    return t;
  };
  for (const GpuParameter& p : params_.all()) {
    out.emplace_back(p.name + ".exp_avg", download(exp_avg_.as<float>() + p.offset, p.shape));
    out.emplace_back(p.name + ".exp_avg_sq", download(exp_avg_sq_.as<float>() + p.offset, p.shape));
    if (has_masters_in_state(params_))
      out.emplace_back(p.name + ".master", download(p.master, p.shape));
  }
  return out;
}

void GpuAdamW::load_state(const NamedTensors& tensors) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  auto upload = [&](const std::string& name, float* device, const Shape& shape) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw_error("optimizer state: tensor '", name, "' is missing");
    if (it->second->shape() != shape)
      throw_error("optimizer state: tensor '", name, "' has shape ",
                  shape_to_string(it->second->shape()), ", expected ", shape_to_string(shape));
    if (it->second->dtype() != DType::F32)
      throw_error("optimizer state: tensor '", name, "' is ", dtype_name(it->second->dtype()),
                  ", expected f32");
    copy_to_device(device, it->second->f32(), it->second->nbytes());
  };
  for (GpuParameter& p : params_.all()) {
    upload(p.name + ".exp_avg", exp_avg_.as<float>() + p.offset, p.shape);
    upload(p.name + ".exp_avg_sq", exp_avg_sq_.as<float>() + p.offset, p.shape);
    if (has_masters_in_state(params_)) upload(p.name + ".master", p.master, p.shape);
  }
  params_.refresh_working_copies();
}

}  // namespace loom::gpu
