#pragma once
// Finite-difference gradient checking shared by the kernel and module tests.
// The loss is L = sum(output * probe) for a fixed random probe (or the model's own loss), so
// the analytic input gradient is the backward of `probe`.
//
// Step and tolerance. The kernels and the model compute in f32 (only the final dot is in
// double), so the check is a central difference of an f32 function, whose error is
//     |D(h) - L'(x)| <= M3 h^2 / 6 + eps_L / h
// (truncation: Taylor's remainder, M3 = max |L'''| along the element; rounding: eps_L is the f32
// rounding error of one evaluation of L, which the two evaluations do not share). Inputs and
// weights here are O(1-10), so M3 = O(10); eps_L ~ 10 u |L| with u = 2^-24 and |L| = O(1-10),
// so eps_L <~ 1e-6. The error is smallest at h = (3 eps_L / M3)^(1/3) ~ 7e-3, and within a
// factor of 2 of that minimum from 5e-3 to 2e-2; at h = 1e-2 the two terms are ~2e-4 and ~1e-4.
// Normalised by the gradient's scale (max |analytic| of the tensor, >= 0.6 in every check here)
// that predicts a worst error of ~5e-4, and kGradCheckTolerance = 3e-3 sits 6x above it.
// A sweep of h from 1e-1 to 1e-3 bears the model out: the error falls as h^2 down to 1e-2 and
// grows as 1/h below 3e-3; at h = 1e-2 the worst kernel error is 3e-5 and the worst model
// parameter 4e-4 (GPT-2's h.1.ln_1.weight, rounding-dominated). A gradient 0.5% off fails
// (KernelGrad.CheckCatchesAHalfPercentGradientError); the former tolerances (2e-2 for kernels,
// 3e-2 for the model) let a 1% error through.
// The step divided by is the difference of the perturbed f32 values, not 2h: x +- h rounds.
#include <cmath>
#include <functional>
#include <vector>

#include "loom/core/rng.hpp"

namespace loom::test {

inline constexpr double kGradCheckTolerance = 3e-3;
inline constexpr float kGradCheckStep = 1e-2f;

inline std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  CounterRng rng(seed, 0);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(rng.normal(i));
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares analytic[i] with (L(x + h e_i) - L(x - h e_i)) / 2h for every i (or `max_checks`
// evenly spaced i). Returns the largest error normalised by max(|analytic|_inf, 1e-3).
inline double max_gradient_error(std::vector<float>& x, const std::vector<float>& analytic,
                                 const std::function<double()>& loss, size_t max_checks = 200,
                                 float step = kGradCheckStep) {
  double scale = 1e-3;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  double worst = 0.0;
  const size_t stride = std::max<size_t>(1, x.size() / max_checks);
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + step;
    const double plus = loss(), x_plus = x[i];
    x[i] = saved - step;
    const double minus = loss(), x_minus = x[i];
    x[i] = saved;
    const double numeric = (plus - minus) / (x_plus - x_minus);
    worst = std::max(worst, std::fabs(numeric - analytic[i]) / scale);
  }
  return worst;
}

}  // namespace loom::test
