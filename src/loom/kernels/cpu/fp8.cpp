#include "loom/kernels/cpu/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::cpu {

Fp8Spec fp8_spec(Fp8Format format) {
  // OCP OFP8 specification v1.0, table 1.
  if (format == Fp8Format::E4M3) return {3, 7, -6, 448.0f};
  return {2, 15, -14, 57344.0f};
}

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::E4M3 ? "e4m3" : "e5m2";
}

float round_to_fp8(float x, Fp8Format format) {
  if (std::isnan(x)) return x;
  const Fp8Spec s = fp8_spec(format);
  const float a = std::fabs(x);
  if (a >= s.max_finite) return std::copysign(s.max_finite, x);
  if (a == 0.0f) return x;
  // The grid step of a's binade (the subnormal step below the smallest normal): a / step is
  // exact (a power-of-two scaling), and nearbyint rounds it to an integer with ties to even,
  // which is an even mantissa. Rounding up may reach the next binade's first value, which is
  // on the grid too; it cannot pass max_finite, itself a grid point above a.
  int exponent = 0;
  (void)std::frexp(a, &exponent);  // a = m 2^exponent, m in [0.5, 1)
  const int binade = std::max(exponent - 1, s.min_normal_exponent);
  const float step = std::ldexp(1.0f, binade - s.mantissa_bits);
  return std::copysign(std::nearbyint(a / step) * step, x);
}

uint8_t fp8_encode(float x, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  const auto sign = static_cast<uint8_t>(std::signbit(x) ? 0x80 : 0x00);
  // E4M3's NaN is S.1111.111; E5M2's a quiet NaN S.11111.10.
  if (std::isnan(x)) return static_cast<uint8_t>(sign | (format == Fp8Format::E4M3 ? 0x7F : 0x7E));
  const float r = std::fabs(round_to_fp8(x, format));
  if (r == 0.0f) return sign;
  int exponent = 0;
  (void)std::frexp(r, &exponent);
  const int e = exponent - 1;
  const int mantissa_one = 1 << s.mantissa_bits;
  if (e < s.min_normal_exponent)  // subnormal: exponent field 0, r = m 2^(emin - M)
    return static_cast<uint8_t>(
        sign | static_cast<int>(std::ldexp(r, s.mantissa_bits - s.min_normal_exponent)));
  const int mantissa = static_cast<int>(std::ldexp(r, s.mantissa_bits - e)) - mantissa_one;
  return static_cast<uint8_t>(sign | ((e + s.exponent_bias) << s.mantissa_bits) | mantissa);
}

float fp8_decode(uint8_t code, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  const bool negative = (code & 0x80) != 0;
  const int field = (code & 0x7F) >> s.mantissa_bits;
  const int mantissa = code & ((1 << s.mantissa_bits) - 1);
  const int top_field = (1 << (7 - s.mantissa_bits)) - 1;
  float value = 0.0f;
  if (format == Fp8Format::E4M3 && field == top_field && mantissa == 7) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (format == Fp8Format::E5M2 && field == top_field) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else if (field == 0) {
    value = std::ldexp(static_cast<float>(mantissa), s.min_normal_exponent - s.mantissa_bits);
  } else {
    value = std::ldexp(static_cast<float>(mantissa + (1 << s.mantissa_bits)),
                       field - s.exponent_bias - s.mantissa_bits);
  }
  return negative ? -value : value;
}

float abs_max(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

float fp8_scale(float amax, Fp8Format format, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const float scale = std::ldexp(fp8_spec(format).max_finite / amax, -margin);
  // An amax below max_finite / FLT_MAX (about 1e-36) overflows: the largest float instead, as
  // Transformer Engine's compute_scale_from_amax does, so 1 / scale stays above zero and a zero
  // element dequantises to zero, not 0 x inf.
  return std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
}

namespace {
void quantize_block(float* out, int64_t out_stride, const float* in, int64_t in_stride,
                    int64_t rows, int64_t cols, float scale, Fp8Format format) {
  const float inverse = 1.0f / scale;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * out_stride + c] = round_to_fp8(in[r * in_stride + c] * scale, format) * inverse;
}
}  // namespace

void quantize_dequantize(float* out, int64_t out_stride, const float* in, int64_t in_stride,
                         int64_t rows, int64_t cols, float scale, Fp8Format format) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    quantize_block(out + r * out_stride, out_stride, in + r * in_stride, in_stride, 1, cols, scale,
                   format);
}

float quantize_dequantize_tiles(float* out, int64_t out_stride, const float* in, int64_t in_stride,
                                int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                                Fp8Format format, int margin) {
  const int64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
  float largest = 0.0f;
  // Each row of tiles on its own thread; each tile's scale from its own amax.
#pragma omp parallel for schedule(static) reduction(max : largest)
  for (int64_t t = 0; t < row_tiles; ++t) {
    const int64_t r0 = t * tile_rows, nr = std::min(tile_rows, rows - r0);
    for (int64_t c0 = 0; c0 < cols; c0 += tile_cols) {
      const int64_t nc = std::min(tile_cols, cols - c0);
      float amax = 0.0f;
      for (int64_t r = r0; r < r0 + nr; ++r)
        amax = std::max(amax, abs_max(in + r * in_stride + c0, nc));
      largest = std::max(largest, amax);
      quantize_block(out + r0 * out_stride + c0, out_stride, in + r0 * in_stride + c0, in_stride,
                     nr, nc, fp8_scale(amax, format, margin), format);
    }
  }
  return largest;
}

}  // namespace loom::cpu
