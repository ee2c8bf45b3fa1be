#include "loom/model/linear.hpp"

#include "loom/kernels/cpu/gemm.hpp"

namespace loom {

void allocate_parameter(Parameter& p, std::string name, const Shape& shape, bool weight_decay,
                        bool hf_transposed) {
  p.name = std::move(name);
  p.value = Tensor::zeros(shape, DType::F32, MemCategory::Parameters);
  p.grad = Tensor::zeros(shape, DType::F32, MemCategory::Gradients);
  p.weight_decay = weight_decay;
  p.hf_transposed = hf_transposed;
}

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool bias,
               bool hf_transposed)
    : in_features_(in_features), out_features_(out_features) {
  allocate_parameter(weight, name + ".weight", {out_features, in_features}, true, hf_transposed);
  if (bias) allocate_parameter(this->bias, name + ".bias", {out_features}, false);
}

void Linear::forward(float* out, int64_t out_ld, const float* input, int64_t rows) const {
  cpu::linear_forward(out, out_ld, input, weight.value.f32(),
                      has_bias() ? bias.value.f32() : nullptr, rows, in_features_,
                      out_features_);
}

void Linear::backward(float* d_input, bool accumulate_input, const float* d_out, int64_t d_out_ld,
                      const float* input, int64_t rows) {
  cpu::linear_backward(d_input, accumulate_input, weight.grad.f32(),
                       has_bias() ? bias.grad.f32() : nullptr, d_out, d_out_ld, input,
                       weight.value.f32(), rows, in_features_, out_features_);
}

void Linear::collect(ParameterList& out) {
  out.push_back(&weight);
  if (has_bias()) out.push_back(&bias);
}

}  // namespace loom
