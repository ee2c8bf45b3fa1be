#include "loom/model/linear.hpp"

#include "loom/kernels/ops.hpp"

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

void Linear::forward(const Tensor& out, int64_t out_col, const Tensor& input) const {
  if (fp8_) return fp8_->forward(out, out_col, input, weight.value, has_bias() ? &bias.value : nullptr);
  ops::linear_forward(out, out_col, input, weight.value, has_bias() ? &bias.value : nullptr);
}

void Linear::backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                      int64_t d_out_col, const Tensor& input) {
  if (fp8_)
    return fp8_->backward(d_input, accumulate_input, weight.grad, has_bias() ? bias.grad : Tensor(), d_out,
                          d_out_col, input, weight.value);
  ops::linear_backward(d_input, accumulate_input, weight.grad, has_bias() ? bias.grad : Tensor(),
                       d_out, d_out_col, input, weight.value);
}

void Linear::forward_unbiased(const Tensor& out, int64_t out_col, const Tensor& input) const {
  if (fp8_) return fp8_->forward(out, out_col, input, weight.value, nullptr);
  ops::linear_forward(out, out_col, input, weight.value, nullptr);
}

void Linear::input_grad(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                        int64_t d_out_col) const {
  if (fp8_)
    return fp8_->backward_input_half(d_input, accumulate_input, d_out, d_out_col, weight.value);
  ops::linear_input_grad(d_input, accumulate_input, d_out, d_out_col, weight.value);
}

void Linear::weight_grad(const Tensor& d_out, int64_t d_out_col, const Tensor& input,
                         bool with_bias) {
  const Tensor d_bias = with_bias && has_bias() ? bias.grad : Tensor();
  if (fp8_)
    return fp8_->backward_weight_half(weight.grad, d_bias, d_out, d_out_col, input, weight.value);
  ops::linear_backward(Tensor(), false, weight.grad, d_bias, d_out, d_out_col, input, weight.value);
}

void Linear::backward_unbiased(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                               int64_t d_out_col, const Tensor& input) {
  if (fp8_)
    return fp8_->backward(d_input, accumulate_input, weight.grad, Tensor(), d_out, d_out_col, input,
                          weight.value);
  ops::linear_backward(d_input, accumulate_input, weight.grad, Tensor(), d_out, d_out_col, input,
                       weight.value);
}

bool Linear::forward_gelu(const Tensor& act, const Tensor& pre, const Tensor& input) const {
  if (fp8_) return false;
  return ops::linear_gelu_forward(act, pre, input, weight.value,
                                  has_bias() ? &bias.value : nullptr);
}

bool Linear::backward_through_gelu(const Tensor& d_pre, const Tensor& d_out, const Tensor& input,
                                   const Tensor& pre) {
  if (fp8_) return false;
  return ops::linear_backward_through_gelu(d_pre, weight.grad, has_bias() ? bias.grad : Tensor(),
                                           d_out, input, weight.value, pre);
}

Fp8Linear* Linear::enable_fp8(std::shared_ptr<Fp8Context> context) {
  fp8_ = std::make_unique<Fp8Linear>(std::move(context));
  return fp8_.get();
}

void Linear::collect(ParameterList& out) {
  out.push_back(&weight);
  if (has_bias()) out.push_back(&bias);
}

}  // namespace loom
