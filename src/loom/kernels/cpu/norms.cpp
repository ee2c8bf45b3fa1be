#include "loom/kernels/cpu/norms.hpp"

#include <omp.h>

#include <cmath>
#include <vector>

namespace loom::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* input,
                       const float* weight, const float* bias, int64_t rows, int64_t dim,
                       float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = input + r * dim;
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum += x[i];
    const float m = sum / static_cast<float>(dim);
    float var = 0.0f;
    for (int64_t i = 0; i < dim; ++i) var += (x[i] - m) * (x[i] - m);
    const float s = 1.0f / std::sqrt(var / static_cast<float>(dim) + eps);
    float* y = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

namespace {
// Per-thread partial sums of weight (and bias) gradients, added up in thread order.
struct PartialSums {
  PartialSums(int64_t dim, int vectors) : dim(dim), data(static_cast<size_t>(omp_get_max_threads() * vectors * dim), 0.0f) {}
  float* slot(int thread, int vector, int vectors) { return data.data() + (thread * vectors + vector) * dim; }
  int64_t dim;
  std::vector<float> data;
};
}  // namespace

void layernorm_backward(float* d_input, float* d_weight, float* d_bias, const float* d_out,
                        const float* input, const float* weight, const float* mean,
                        const float* rstd, int64_t rows, int64_t dim) {
  PartialSums partial(dim, 2);
  int used_threads = 1;
#pragma omp parallel
  {
    const int thread = omp_get_thread_num();
#pragma omp single
    used_threads = omp_get_num_threads();
    float* dw = partial.slot(thread, 0, 2);
    float* db = partial.slot(thread, 1, 2);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = input + r * dim;
      const float* dy = d_out + r * dim;
      const float m = mean[r], s = rstd[r];
      // dx = s * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * weight.
      float mean_g = 0.0f, mean_gx = 0.0f;
      for (int64_t i = 0; i < dim; ++i) {
        const float xhat = (x[i] - m) * s;
        const float g = dy[i] * weight[i];
        mean_g += g;
        mean_gx += g * xhat;
        dw[i] += dy[i] * xhat;
        db[i] += dy[i];
      }
      mean_g /= static_cast<float>(dim);
      mean_gx /= static_cast<float>(dim);
      float* dx = d_input + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        const float xhat = (x[i] - m) * s;
        dx[i] += s * (dy[i] * weight[i] - mean_g - xhat * mean_gx);
      }
    }
  }
  for (int t = 0; t < used_threads; ++t) {
    const float* dw = partial.slot(t, 0, 2);
    const float* db = partial.slot(t, 1, 2);
    for (int64_t i = 0; i < dim; ++i) {
      d_weight[i] += dw[i];
      d_bias[i] += db[i];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* input, const float* weight,
                     int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = input + r * dim;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
    const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    float* y = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * s * weight[i];
    rstd[r] = s;
  }
}

void rmsnorm_backward(float* d_input, float* d_weight, const float* d_out, const float* input,
                      const float* weight, const float* rstd, int64_t rows, int64_t dim) {
  PartialSums partial(dim, 1);
  int used_threads = 1;
#pragma omp parallel
  {
    const int thread = omp_get_thread_num();
#pragma omp single
    used_threads = omp_get_num_threads();
    float* dw = partial.slot(thread, 0, 1);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = input + r * dim;
      const float* dy = d_out + r * dim;
      const float s = rstd[r];
      // dx = s * (g - xhat * mean(g * xhat)), with g = dy * weight and xhat = x * s.
      float mean_gx = 0.0f;
      for (int64_t i = 0; i < dim; ++i) {
        const float xhat = x[i] * s;
        mean_gx += dy[i] * weight[i] * xhat;
        dw[i] += dy[i] * xhat;
      }
      mean_gx /= static_cast<float>(dim);
      float* dx = d_input + r * dim;
      for (int64_t i = 0; i < dim; ++i) dx[i] += s * (dy[i] * weight[i] - x[i] * s * mean_gx);
    }
  }
  for (int t = 0; t < used_threads; ++t) {
    const float* dw = partial.slot(t, 0, 1);
    for (int64_t i = 0; i < dim; ++i) d_weight[i] += dw[i];
  }
}

}  // namespace loom::cpu
