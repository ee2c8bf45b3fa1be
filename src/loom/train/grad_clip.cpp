#include "loom/train/grad_clip.hpp"

#include <cmath>

#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

double global_grad_norm(const ParameterList& params) {
  double sum = 0.0;
  for (const Parameter* p : params) sum += cpu::sum_of_squares(p->grad.f32(), p->grad.numel());
  return std::sqrt(sum);
}

double clip_factor(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const ParameterList& params, double max_norm) {
  const double norm = global_grad_norm(params);
  const double factor = clip_factor(norm, max_norm);
  if (factor != 1.0)
    for (Parameter* p : params) cpu::scale_inplace(p->grad.f32(), static_cast<float>(factor), p->grad.numel());
  return norm;
}

}  // namespace loom
