#include "loom/kernels/cpu/gemm.hpp"

#include <cblas.h>
#include <omp.h>

namespace loom::cpu {

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void linear_forward(float* out, int64_t out_ld, const float* input, const float* weight,
                    const float* bias, int64_t n, int64_t in_features, int64_t out_features) {
  if (bias) {
    // Seed the output with the bias and let SGEMM accumulate (beta = 1): one pass fewer.
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < n; ++row) {
      float* dst = out + row * out_ld;
      for (int64_t j = 0; j < out_features; ++j) dst[j] = bias[j];
    }
  }
  sgemm(false, true, n, out_features, in_features, 1.0f, input, in_features, weight,
        in_features, bias ? 1.0f : 0.0f, out, out_ld);
}

void linear_backward(float* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const float* d_out, int64_t d_out_ld, const float* input,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features) {
  if (d_input)
    sgemm(false, false, n, in_features, out_features, 1.0f, d_out, d_out_ld, weight, in_features,
          accumulate_input ? 1.0f : 0.0f, d_input, in_features);
  if (d_weight)
    sgemm(true, false, out_features, in_features, n, 1.0f, d_out, d_out_ld, input, in_features,
          1.0f, d_weight, in_features);
  if (d_bias) {
    // Column sums over blocks of columns: each thread owns its columns (no races) and the
    // inner loop runs along a row, contiguous in memory.
    constexpr int64_t kColumnBlock = 64;
    const int64_t blocks = (out_features + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kColumnBlock;
      const int64_t end = begin + kColumnBlock < out_features ? begin + kColumnBlock : out_features;
      float sums[kColumnBlock] = {};
      for (int64_t row = 0; row < n; ++row) {
        const float* src = d_out + row * d_out_ld;
        for (int64_t j = begin; j < end; ++j) sums[j - begin] += src[j];
      }
      for (int64_t j = begin; j < end; ++j) d_bias[j] += sums[j - begin];
    }
  }
}

void set_num_threads(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom::cpu

#include <chrono>
#include <vector>

namespace loom::cpu {

double measure_sgemm_gflops(int64_t n, int repeats) {
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm up
  double best_seconds = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best_seconds = std::min(best_seconds, took.count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best_seconds / 1e9;
}

}  // namespace loom::cpu
