#include "loom/gpu/gpu_parameters.hpp"

#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/elementwise.hpp"

namespace loom::gpu {

namespace {
// 128 elements = 256 bytes of bf16 (512 of f32): each parameter's start is 256-byte aligned in
// every flat buffer, whatever its element type.
constexpr int64_t kAlignElements = 128;

int64_t aligned_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }
}  // namespace

GpuParameterSet::GpuParameterSet(const ParameterList& host, DType compute_dtype)
    : compute_dtype_(compute_dtype) {
  for (const Parameter* p : host) {
    if (!p->value.defined())
      throw_error("GPU model: parameter '", p->name,
                  "' has no value on the host (a ZeRO-3 shard?)");
    GpuParameter g;
    g.name = p->name;
    g.shape = p->value.shape();
    g.numel = p->value.numel();
    g.offset = padded_elements_;
    g.weight_decay = p->weight_decay;
    padded_elements_ += aligned_up(g.numel);
    params_.push_back(std::move(g));
    host_of_.push_back(p);
  }
  const bool bf16_compute = compute_dtype_ == DType::BF16;
  // Under bf16 the model's parameters are the bf16 copies and the masters belong to the
  // optimizer, as loom::AdamW counts them on the CPU; under f32 the masters are the parameters.
  masters_ = DeviceBuffer::of<float>(
      padded_elements_, bf16_compute ? MemCategory::OptimizerState : MemCategory::Parameters);
  grads_ = DeviceBuffer::of<float>(padded_elements_, MemCategory::Gradients);
  if (bf16_compute) working_ = DeviceBuffer::of<bf16>(padded_elements_, MemCategory::Parameters);
  masters_.zero();
  grads_.zero();
  working_.zero();
  for (GpuParameter& g : params_) {
    g.master = masters_.as<float>() + g.offset;
    g.grad = grads_.as<float>() + g.offset;
    g.working = bf16_compute ? working_.as<bf16>() + g.offset : nullptr;
  }
}

const GpuParameter& GpuParameterSet::of(const Parameter& host) const {
  const auto it = std::find(host_of_.begin(), host_of_.end(), &host);
  LOOM_CHECK(it != host_of_.end(), "parameter '", host.name, "' is not one of the GPU model's");
  return params_[static_cast<size_t>(it - host_of_.begin())];
}

void GpuParameterSet::check_matches(const ParameterList& host) const {
  if (host.size() != params_.size())
    throw_error("GPU model: the host model has ", host.size(), " parameters, the GPU model ",
                params_.size());
  for (size_t i = 0; i < host.size(); ++i)
    if (host[i]->name != params_[i].name || host[i]->value.shape() != params_[i].shape)
      throw_error("GPU model: host parameter ", i, " is '", host[i]->name, "' ",
                  shape_to_string(host[i]->value.shape()), ", the GPU model's is '",
                  params_[i].name, "' ", shape_to_string(params_[i].shape));
}

void GpuParameterSet::upload_from(const ParameterList& host) {
  check_matches(host);
  for (size_t i = 0; i < host.size(); ++i)
    copy_to_device(params_[i].master, host[i]->value.f32(),
                   static_cast<size_t>(params_[i].numel) * sizeof(float));
  refresh_working_copies();
}

void GpuParameterSet::download_to(const ParameterList& host) const {
  check_matches(host);
  if (compute_dtype_ != DType::BF16) {
    for (size_t i = 0; i < host.size(); ++i)
      copy_to_host(host[i]->value.f32(), params_[i].master,
                   static_cast<size_t>(params_[i].numel) * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits;
  for (size_t i = 0; i < host.size(); ++i) {
    const GpuParameter& g = params_[i];
    bits.resize(static_cast<size_t>(g.numel));
    copy_to_host(bits.data(), g.working, bits.size() * sizeof(uint16_t));
    float* out = host[i]->value.f32();
    for (size_t k = 0; k < bits.size(); ++k) out[k] = bf16_to_f32(bits[k]);
  }
}

void GpuParameterSet::refresh_working_copies() {
  if (compute_dtype_ == DType::BF16)
    cuda::convert(working_.as<bf16>(), masters_.as<float>(), padded_elements_);
}

void GpuParameterSet::zero_grads() { grads_.zero(); }

double GpuParameterSet::grad_sum_of_squares() const {
  return cuda::sum_of_squares(grads_.as<float>(), padded_elements_);
}

}  // namespace loom::gpu
