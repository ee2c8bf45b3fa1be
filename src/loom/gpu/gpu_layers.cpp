#include "loom/gpu/gpu_layers.hpp"

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/gemm.hpp"
#include "loom/kernels/cuda/norms.hpp"

namespace loom::gpu {

namespace {
float* grad_or_null(const GpuParameter* p) { return p ? p->grad : nullptr; }
template <typename T>
const T* value_or_null(const GpuParameter* p) {
  return p ? p->value<T>() : nullptr;
}

// Splits what a projection collects (weight, [bias], weight, [bias], ...) into linears.
std::vector<GpuLinear> linears_of(const ParameterList& collected, const GpuParameterSet& params) {
  std::vector<GpuLinear> linears;
  for (const Parameter* p : collected) {
    const GpuParameter& g = params.of(*p);
    if (g.shape.size() == 2) {
      linears.push_back({&g, nullptr, g.shape[1], g.shape[0]});
    } else {
      LOOM_CHECK(g.shape.size() == 1 && !linears.empty() && !linears.back().bias &&
                     g.shape[0] == linears.back().out_features,
                 "parameter '", g.name, "' ", shape_to_string(g.shape),
                 " is not the bias of the linear before it");
      linears.back().bias = &g;
    }
  }
  return linears;
}
}  // namespace

template <typename T>
void GpuLinear::forward(T* out, int64_t out_ld, const T* input, int64_t rows) const {
  cuda::linear_forward(out, out_ld, input, weight->value<T>(), value_or_null<T>(bias), rows,
                       in_features, out_features);
}

template <typename T>
void GpuLinear::backward(T* d_input, bool accumulate_input, const T* d_out, int64_t d_out_ld,
                         const T* input, int64_t rows) const {
  cuda::linear_backward(d_input, accumulate_input, weight->grad, grad_or_null(bias), d_out,
                        d_out_ld, input, weight->value<T>(), rows, in_features, out_features);
}

template <typename T>
void GpuFanOut::forward(T* out, int64_t out_ld, const T* input, int64_t rows) const {
  int64_t column = 0;
  for (const GpuLinear& linear : linears) {
    linear.forward(out + column, out_ld, input, rows);
    column += linear.out_features;
  }
}

template <typename T>
void GpuFanOut::backward(T* d_input, const T* d_out, int64_t d_out_ld, const T* input,
                         int64_t rows) const {
  // The first projection writes d_input, the others add to it (LocalFanOut::backward).
  int64_t column = 0;
  for (size_t i = 0; i < linears.size(); ++i) {
    linears[i].backward(d_input, i > 0, d_out + column, d_out_ld, input, rows);
    column += linears[i].out_features;
  }
}

template <typename T>
void GpuNorm::forward(T* out, float* mean, float* rstd, const T* input, int64_t rows) const {
  if (layer_norm)
    cuda::layernorm_forward(out, mean, rstd, input, weight->value<T>(), bias->value<T>(), rows, dim,
                            eps);
  else
    cuda::rmsnorm_forward(out, rstd, input, weight->value<T>(), rows, dim, eps);
}

template <typename T>
void GpuNorm::backward(T* d_input, const T* d_out, const T* input, const float* mean,
                       const float* rstd, int64_t rows) const {
  if (layer_norm)
    cuda::layernorm_backward(d_input, weight->grad, bias->grad, d_out, input, weight->value<T>(),
                             mean, rstd, rows, dim);
  else
    cuda::rmsnorm_backward(d_input, weight->grad, d_out, input, weight->value<T>(), rstd, rows,
                           dim);
}

template void GpuLinear::forward(float*, int64_t, const float*, int64_t) const;
template void GpuLinear::forward(bf16*, int64_t, const bf16*, int64_t) const;
template void GpuLinear::backward(float*, bool, const float*, int64_t, const float*, int64_t) const;
template void GpuLinear::backward(bf16*, bool, const bf16*, int64_t, const bf16*, int64_t) const;
template void GpuFanOut::forward(float*, int64_t, const float*, int64_t) const;
template void GpuFanOut::forward(bf16*, int64_t, const bf16*, int64_t) const;
template void GpuFanOut::backward(float*, const float*, int64_t, const float*, int64_t) const;
template void GpuFanOut::backward(bf16*, const bf16*, int64_t, const bf16*, int64_t) const;
template void GpuNorm::forward(float*, float*, float*, const float*, int64_t) const;
template void GpuNorm::forward(bf16*, float*, float*, const bf16*, int64_t) const;
template void GpuNorm::backward(float*, const float*, const float*, const float*, const float*,
                                int64_t) const;
template void GpuNorm::backward(bf16*, const bf16*, const bf16*, const float*, const float*,
                                int64_t) const;

GpuFanOut gpu_fan_out(FanOutProjection& host, const GpuParameterSet& params) {
  ParameterList collected;
  host.collect(collected);
  GpuFanOut fan_out;
  fan_out.linears = linears_of(collected, params);
  for (const GpuLinear& linear : fan_out.linears) fan_out.width += linear.out_features;
  LOOM_CHECK(fan_out.width == host.width(), "GPU fan-out of width ", fan_out.width, ", host ",
             host.width());
  return fan_out;
}

GpuLinear gpu_fan_in(FanInProjection& host, const GpuParameterSet& params) {
  ParameterList collected;
  host.collect(collected);
  std::vector<GpuLinear> linears = linears_of(collected, params);
  LOOM_CHECK(linears.size() == 1, "a fan-in projection of ", linears.size(), " linears");
  return linears.front();
}

GpuNorm gpu_norm(Norm& host, int64_t dim, float eps, const GpuParameterSet& params) {
  GpuNorm norm;
  norm.layer_norm = host.kind() == NormKind::LayerNorm;
  norm.weight = &params.of(host.weight);
  norm.bias = norm.layer_norm ? &params.of(host.bias) : nullptr;
  norm.dim = dim;
  norm.eps = eps;
  return norm;
}

}  // namespace loom::gpu
