#include <cmath>

#include "loom/kernels/cuda/adamw.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"

namespace loom::cuda {

namespace {

// Per-step scalars, computed on the host in double exactly as the CPU kernel does.
struct AdamWScalars {
  float beta1, beta2, eps, grad_multiplier;
  float bias_correction2_sqrt, step_size, decay;
};

__global__ void adamw_kernel(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                             float* exp_avg_sq, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i] * s.grad_multiplier;
    const float m = s.beta1 * exp_avg[i] + (1.0f - s.beta1) * g;
    const float v = s.beta2 * exp_avg_sq[i] + (1.0f - s.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
    const float p = param[i] * s.decay - s.step_size * m / denom;
    param[i] = p;
    if (param_bf16) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

void adamw_impl(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, const AdamWStep& step, cudaStream_t stream) {
  if (n <= 0) return;
  const double t = static_cast<double>(step.step);
  AdamWScalars s{};
  s.beta1 = step.beta1;
  s.beta2 = step.beta2;
  s.eps = step.eps;
  s.grad_multiplier = step.grad_multiplier;
  const auto bias_correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(step.beta1), t));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(step.beta2), t)));
  s.step_size = step.lr / bias_correction1;
  s.decay = 1.0f - step.lr * step.weight_decay;
  constexpr int kThreads = 256;
  adamw_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(param, param_bf16, grad,
                                                                       exp_avg, exp_avg_sq, n, s);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step, cudaStream_t stream) {
  adamw_impl(param, nullptr, grad, exp_avg, exp_avg_sq, n, step, stream);
}
void adamw_update(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                  float* exp_avg_sq, int64_t n, const AdamWStep& step, cudaStream_t stream) {
  adamw_impl(param, param_bf16, grad, exp_avg, exp_avg_sq, n, step, stream);
}

}  // namespace loom::cuda
