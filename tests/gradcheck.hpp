#pragma once
// Finite-difference gradient checking shared by the kernel and module tests.
// The loss is L = sum(output * probe) for a fixed random probe, so the analytic input
// gradient is the backward of `probe`. Central differences in f32 with a step of 1e-2 give
// about 1e-3 relative accuracy on smooth functions; tolerances below are set from that.
#include <cmath>
#include <functional>
#include <vector>

#include "loom/core/rng.hpp"

namespace loom::test {

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
// evenly spaced i). Returns the largest error normalised by max(|analytic|_inf, 1).
inline double max_gradient_error(std::vector<float>& x, const std::vector<float>& analytic,
                                 const std::function<double()>& loss, size_t max_checks = 200,
                                 float step = 1e-2f) {
  double scale = 1e-3;
  for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  double worst = 0.0;
  const size_t stride = std::max<size_t>(1, x.size() / max_checks);
  for (size_t i = 0; i < x.size(); i += stride) {
    const float saved = x[i];
    x[i] = saved + step;
    const double plus = loss();
    x[i] = saved - step;
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2.0 * step);
    worst = std::max(worst, std::fabs(numeric - analytic[i]) / scale);
  }
  return worst;
}

}  // namespace loom::test
