#include "loom/train/grad_clip.hpp"

#include <cmath>

#include "loom/kernels/cpu/elementwise.hpp"

namespace loom {

double global_grad_norm(const ParameterList& params) {
  double sum = 0.0;
  for (const Parameter* p : params) sum += cpu::sum_of_squares(p->grad.f32(), p->grad.numel());
  return std::sqrt(sum);
}

double sum_squares_over_tp(double sharded, double replicated, ProcessGroup* tp) {
  if (tp == nullptr || tp->size() == 1) return sharded + replicated;
  float value = static_cast<float>(sharded);
  tp->all_reduce(&value, 1, ReduceOp::Sum)->wait();
  return static_cast<double>(value) + replicated;
}

double global_grad_norm(const ParameterList& params, ProcessGroup* tp) {
  double sharded = 0.0, replicated = 0.0;
  for (const Parameter* p : params)
    (p->placement.replicated ? replicated : sharded) += cpu::sum_of_squares(p->grad.f32(), p->grad.numel());
  return std::sqrt(sum_squares_over_tp(sharded, replicated, tp));
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
