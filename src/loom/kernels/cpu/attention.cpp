#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cpu/fast_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace loom::cpu {

namespace {
constexpr int64_t kKeyTile = 64;  // keys scored per tile; 64 scores stay in registers/L1

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float* y, float alpha, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s) {
  const int64_t ld = s.qkv_ld(), d = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t rows = s.batch * s.heads * s.seq_len;
  // One task per (batch, head, query); dynamic scheduling evens out the causal triangle.
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t task = 0; task < rows; ++task) {
    const int64_t i = task % s.seq_len;
    const int64_t h = (task / s.seq_len) % s.heads;
    const int64_t b = task / (s.seq_len * s.heads);
    const int64_t kvh = h / group;
    const float* q = qkv + (b * s.seq_len + i) * ld + h * d;
    const float* k_base = qkv + b * s.seq_len * ld + (s.heads + kvh) * d;
    const float* v_base = qkv + b * s.seq_len * ld + (s.heads + s.kv_heads + kvh) * d;
    float* o = out + (b * s.seq_len + i) * s.out_ld() + h * d;
    std::memset(o, 0, static_cast<size_t>(d) * sizeof(float));
    float running_max = -std::numeric_limits<float>::infinity();
    float running_sum = 0.0f;
    float scores[kKeyTile];
    for (int64_t j0 = 0; j0 <= i; j0 += kKeyTile) {
      const int64_t j1 = std::min(j0 + kKeyTile, i + 1);
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = j0; j < j1; ++j) {
        scores[j - j0] = scale * dot(q, k_base + j * ld, d);
        tile_max = std::max(tile_max, scores[j - j0]);
      }
      const float new_max = std::max(running_max, tile_max);
      const float correction = std::exp(running_max - new_max);
      running_sum *= correction;
      for (int64_t c = 0; c < d; ++c) o[c] *= correction;
      for (int64_t j = j0; j < j1; ++j) {
        const float p = fast_exp(scores[j - j0] - new_max);
        running_sum += p;
        axpy(o, p, v_base + j * ld, d);
      }
      running_max = new_max;
    }
    const float inv = 1.0f / running_sum;
    for (int64_t c = 0; c < d; ++c) o[c] *= inv;
    lse[(b * s.heads + h) * s.seq_len + i] = running_max + std::log(running_sum);
  }
}

void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s) {
  const int64_t ld = s.qkv_ld(), d = s.head_dim, group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, kv head): the task owns dK and dV of that head (shared by `group`
  // query heads), so no two threads write the same gradient.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < s.batch * s.kv_heads; ++task) {
    const int64_t b = task / s.kv_heads, kvh = task % s.kv_heads;
    const float* row0 = qkv + b * s.seq_len * ld;
    float* d_row0 = d_qkv + b * s.seq_len * ld;
    const int64_t k_col = (s.heads + kvh) * d, v_col = (s.heads + s.kv_heads + kvh) * d;
    for (int64_t t = 0; t < s.seq_len; ++t) {
      std::memset(d_row0 + t * ld + k_col, 0, static_cast<size_t>(d) * sizeof(float));
      std::memset(d_row0 + t * ld + v_col, 0, static_cast<size_t>(d) * sizeof(float));
    }
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i = 0; i < s.seq_len; ++i) {
        const float* q = row0 + i * ld + h * d;
        float* dq = d_row0 + i * ld + h * d;
        const float* o = out + (b * s.seq_len + i) * s.out_ld() + h * d;
        const float* dout = d_out + (b * s.seq_len + i) * s.out_ld() + h * d;
        const float row_lse = lse[(b * s.heads + h) * s.seq_len + i];
        const float delta = dot(dout, o, d);  // D_i = sum_j P_ij dP_ij = dO_i . O_i
        std::memset(dq, 0, static_cast<size_t>(d) * sizeof(float));
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = row0 + j * ld + k_col;
          const float* v = row0 + j * ld + v_col;
          const float p = fast_exp(scale * dot(q, k, d) - row_lse);
          const float dp = dot(dout, v, d);
          const float ds = p * (dp - delta) * scale;
          axpy(d_row0 + j * ld + v_col, p, dout, d);
          axpy(dq, ds, k, d);
          axpy(d_row0 + j * ld + k_col, ds, q, d);
        }
      }
    }
  }
}

}  // namespace loom::cpu
