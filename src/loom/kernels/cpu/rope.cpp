#include "loom/kernels/cpu/rope.hpp"

#include <cmath>
#include <numbers>

#include "loom/core/error.hpp"

namespace loom::cpu {

double rope_frequency(int64_t i, int64_t head_dim, double theta, const RopeScaling& scaling) {
  // Rounded to f32 as Hugging Face computes inv_freq, so checkpoints behave identically in both.
  const double plain = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  if (scaling.factor <= 0) return plain;
  const double wavelength = 2 * std::numbers::pi / plain;
  const auto context = static_cast<double>(scaling.original_max_positions);
  if (wavelength < context / scaling.high_freq_factor) return plain;
  if (wavelength > context / scaling.low_freq_factor) return static_cast<float>(plain / scaling.factor);
  const double smooth =
      (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
  return static_cast<float>((1 - smooth) * plain / scaling.factor + smooth * plain);
}

RopeTable make_rope_table(int64_t head_dim, int64_t max_positions, double theta, const RopeScaling& scaling) {
  RopeTable table;
  table.head_dim = head_dim;
  table.max_positions = max_positions;
  const int64_t half = head_dim / 2;
  table.cos.resize(static_cast<size_t>(max_positions * half));
  table.sin.resize(static_cast<size_t>(max_positions * half));
  for (int64_t pos = 0; pos < max_positions; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      // inv_freq and the angle are rounded to f32 exactly as Hugging Face computes them, so
      // checkpoints behave identically in both; cos/sin are then evaluated in double.
      const auto inv_freq = static_cast<float>(rope_frequency(i, head_dim, theta, scaling));
      const double angle = static_cast<double>(static_cast<float>(pos) * inv_freq);
      table.cos[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::cos(angle));
      table.sin[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::sin(angle));
    }
  return table;
}

void rope_apply(float* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTable& table, bool inverse, const int32_t* positions) {
  LOOM_CHECK(seq_len <= table.max_positions, "sequence ", seq_len, " longer than RoPE table ",
             table.max_positions);
  const int64_t half = table.head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < batch * seq_len; ++row) {
    const int64_t pos = positions ? positions[row] : row % seq_len;
    const float* c = table.cos.data() + pos * half;
    const float* s = table.sin.data() + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + row * row_ld + h * table.head_dim;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = head[i], b = head[i + half];
        head[i] = a * c[i] - sign * b * s[i];
        head[i + half] = b * c[i] + sign * a * s[i];
      }
    }
  }
}

}  // namespace loom::cpu
