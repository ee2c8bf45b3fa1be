#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/fast_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/gemm.hpp"

namespace loom::cpu {

double lm_head_cross_entropy(const CrossEntropyArgs& a) {
  const int64_t chunk = std::min(std::max<int64_t>(a.vocab_chunk, 1), a.vocab);
  const int64_t chunks = (a.vocab + chunk - 1) / chunk;
  const bool single_chunk = chunks == 1;
  Tensor owned;
  if (!a.workspace) owned = Tensor::empty({a.rows, chunk}, DType::F32, MemCategory::Workspace);
  float* z = a.workspace ? a.workspace : owned.f32();
  std::vector<float> row_max(static_cast<size_t>(a.rows), -std::numeric_limits<float>::infinity());
  std::vector<float> row_sum(static_cast<size_t>(a.rows), 0.0f);
  std::vector<float> target_logit(static_cast<size_t>(a.rows), 0.0f);

  // Pass 1: online log-sum-exp over the chunks, and each row's target logit.
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, a.vocab - v0);
    sgemm(false, true, a.rows, width, a.dim, 1.0f, a.hidden, a.dim, a.weight + v0 * a.dim, a.dim,
          0.0f, z, chunk);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      const float* zr = z + r * chunk;
      float m = row_max[r];
      for (int64_t j = 0; j < width; ++j) m = std::max(m, zr[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < width; ++j) sum += fast_exp(zr[j] - m);
      row_sum[r] = row_sum[r] * std::exp(row_max[r] - m) + sum;
      row_max[r] = m;
      const int32_t t = a.targets[r];
      if (t >= v0 && t < v0 + width) target_logit[r] = zr[t - v0];
    }
  }
  std::vector<float> lse(static_cast<size_t>(a.rows));
  double total = 0.0;
  for (int64_t r = 0; r < a.rows; ++r) {
    lse[r] = row_max[r] + std::log(row_sum[r]);
    const float loss = a.targets[r] >= 0 ? lse[r] - target_logit[r] : 0.0f;
    if (a.row_losses) a.row_losses[r] = loss;
    total += loss;
  }
  if (!a.d_hidden && !a.d_weight) return total;

  // Pass 2: per chunk, d_logits = grad_scale * (softmax - onehot), then the two products.
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, a.vocab - v0);
    if (!single_chunk)
      sgemm(false, true, a.rows, width, a.dim, 1.0f, a.hidden, a.dim, a.weight + v0 * a.dim,
            a.dim, 0.0f, z, chunk);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      float* zr = z + r * chunk;
      const int32_t t = a.targets[r];
      if (t < 0) {
        std::fill(zr, zr + width, 0.0f);
        continue;
      }
      const float row_lse = lse[r];
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) zr[j] = a.grad_scale * fast_exp(zr[j] - row_lse);
      if (t >= v0 && t < v0 + width) zr[t - v0] -= a.grad_scale;
    }
    if (a.d_hidden)
      sgemm(false, false, a.rows, a.dim, width, 1.0f, z, chunk, a.weight + v0 * a.dim, a.dim,
            c == 0 ? 0.0f : 1.0f, a.d_hidden, a.dim);
    if (a.d_weight)
      sgemm(true, false, width, a.dim, a.rows, 1.0f, z, chunk, a.hidden, a.dim, 1.0f,
            a.d_weight + v0 * a.dim, a.dim);
  }
  return total;
}

}  // namespace loom::cpu
