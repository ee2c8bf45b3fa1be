#pragma once
// Matrix products for linear layers, through OpenBLAS's SGEMM. Weights are stored
// [out, in] (row-major), as nn.Linear does, so forward is out = in @ W^T (+ bias).
#include <cstdint>

namespace loom::cpu {

// out[n, out_ld] columns [0, out_features) = input[n, in_features] @ weight^T + bias.
// out_ld lets several projections write side by side into one fused buffer (q|k|v).
void linear_forward(float* out, int64_t out_ld, const float* input, const float* weight,
                    const float* bias, int64_t n, int64_t in_features, int64_t out_features);

// Gradients of linear_forward. d_out has leading dimension d_out_ld.
// d_input = d_out @ W, written (accumulate_input=false) or added (true); may be null.
// d_weight += d_out^T @ input; d_bias += column sums of d_out (may be null).
void linear_backward(float* d_input, bool accumulate_input, float* d_weight, float* d_bias,
                     const float* d_out, int64_t d_out_ld, const float* input,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features);

// Plain row-major C[m,n] = alpha * op(A) @ op(B) + beta * C with explicit leading dims.
void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// Number of threads kernels and OpenBLAS use; set once at start-up.
void set_num_threads(int threads);
int num_threads();

}  // namespace loom::cpu

namespace loom::cpu {
// Measured SGEMM rate (GFLOP/s) of square n x n products on the current thread count:
// the peak that MFU is reported against on a CPU.
double measure_sgemm_gflops(int64_t n = 1536, int repeats = 3);
}  // namespace loom::cpu
