#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/fast_math.hpp"

#include <cmath>

namespace loom::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* input, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = input[i];
    out[i] = 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
  }
}

void gelu_backward(float* d_input, const float* d_out, const float* input, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = input[i];
    const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float t = fast_tanh(inner);
    const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
    d_input[i] = d_out[i] * grad;
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t dim,
                    int64_t in_ld) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * in_ld;
    const float* u = up + r * in_ld;
    float* y = out + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) y[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
  }
}

void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t rows, int64_t dim, int64_t in_ld) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + r * in_ld;
    const float* u = up + r * in_ld;
    const float* dy = d_out + r * dim;
    float* dg = d_gate + r * in_ld;
    float* du = d_up + r * in_ld;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) {
      const float sig = 1.0f / (1.0f + fast_exp(-g[i]));
      const float silu = g[i] * sig;
      du[i] = dy[i] * silu;
      dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
  }
}

}  // namespace loom::cpu
