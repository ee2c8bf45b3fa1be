#include "loom/kernels/cpu/elementwise.hpp"

#include <omp.h>

#include <vector>

#include "loom/core/dtype.hpp"

namespace loom::cpu {

void add_into(float* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void scale_inplace(float* x, float factor, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

double sum_of_squares(const float* x, int64_t n) {
  // Fixed partition and partials added in thread order: OpenMP's reduction clause may combine
  // in any order, which would make clipping (and so exact resume) non-deterministic.
  std::vector<double> partial(static_cast<size_t>(omp_get_max_threads()), 0.0);
  int used_threads = 1;
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    if (thread == 0) used_threads = static_cast<int>(threads);
    double sum = 0.0;
    for (int64_t i = n * thread / threads; i < n * (thread + 1) / threads; ++i)
      sum += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(thread)] = sum;
  }
  double total = 0.0;
  for (int t = 0; t < used_threads; ++t) total += partial[static_cast<size_t>(t)];
  return total;
}

void round_to_bf16_inplace(float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

}  // namespace loom::cpu
