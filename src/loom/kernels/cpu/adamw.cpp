#include "loom/kernels/cpu/adamw.hpp"

#include <cmath>

namespace loom::cpu {

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(s.beta1), t));
  const float bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(s.beta2), t)));
  const float step_size = s.lr / bias_correction1;
  const float decay = 1.0f - s.lr * s.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * s.grad_multiplier;
    const float m = s.beta1 * exp_avg[i] + (1.0f - s.beta1) * g;
    const float v = s.beta2 * exp_avg_sq[i] + (1.0f - s.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bias_correction2_sqrt + s.eps;
    param[i] = param[i] * decay - step_size * m / denom;
  }
}

}  // namespace loom::cpu
