#include "loom/kernels/cpu/fp8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::cpu {

Fp8Spec fp8_spec(Fp8Format format) {
  // OCP OFP8 specification v1.0, table 1.
  if (format == Fp8Format::E4M3) return {3, 7, -6, 448.0f};
  return {2, 15, -14, 57344.0f};
}

const char* fp8_format_name(Fp8Format format) {
  return format == Fp8Format::E4M3 ? "e4m3" : "e5m2";
}

namespace {

// round_to_fp8 without branches, so that the quantisation loops vectorise. The grid step of
// |x|'s binade (the subnormal step below the smallest normal) is 2^(binade - M); adding
// C = 2^(binade - M + 23), whose f32 ulp is that step, rounds |x| onto the grid with the FPU's
// ties-to-even (an even mantissa), and since |x| < 2^(binade + 1) <= C the sum holds the rounded
// value exactly, so subtracting C leaves it. Rounding up may reach the next binade's first
// value, on the grid too, and cannot pass max_finite (a grid point above |x|); at or beyond it,
// infinities included, the result saturates. A NaN stays a NaN (it passes through the sum), a
// zero keeps its sign (the sign bit is put back). This file is built without FMA contraction
// (CMakeLists.txt), so x * scale is rounded to f32 before its rounding to FP8, as on the GPU.
inline float round_to_grid(float x, int mantissa_bits, int min_normal_exponent, float max_finite) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7FFFFFFFu;
  const float a = std::bit_cast<float>(magnitude);
  const int exponent = static_cast<int>(magnitude >> 23) - 127;  // -127 for f32 subnormals
  const int binade = exponent > min_normal_exponent ? exponent : min_normal_exponent;
  const float c =
      std::bit_cast<float>(static_cast<uint32_t>(binade - mantissa_bits + 23 + 127) << 23);
  const float r = a >= max_finite ? max_finite : (a + c) - c;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(r));
}

}  // namespace

float round_to_fp8(float x, Fp8Format format) {
  const Fp8Spec s = fp8_spec(format);
  return round_to_grid(x, s.mantissa_bits, s.min_normal_exponent, s.max_finite);
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
  const Fp8Spec s = fp8_spec(format);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * out_stride;
    const float* x = in + r * in_stride;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      o[c] = round_to_grid(x[c] * scale, s.mantissa_bits, s.min_normal_exponent, s.max_finite) *
             inverse;
  }
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
  if (tile_cols == 1) {
    // Tiles down the columns (128 x 1: the weight gradient's operands), a band of tile_rows rows
    // at a time: every column's amax over the band, then its elements, both loops along the
    // rows. The same amaxes (max of the non-NaN magnitudes, as the loop below takes them), the
    // same scales, the same roundings.
    const Fp8Spec s = fp8_spec(format);
#pragma omp parallel for schedule(static) reduction(max : largest)
    for (int64_t t = 0; t < row_tiles; ++t) {
      const int64_t r0 = t * tile_rows, nr = std::min(tile_rows, rows - r0);
      std::vector<float> amax(static_cast<size_t>(cols), 0.0f), scale(amax.size()),
          inverse(amax.size());
      for (int64_t r = r0; r < r0 + nr; ++r) {
        const float* x = in + r * in_stride;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
          const float a = std::fabs(x[c]);
          amax[static_cast<size_t>(c)] =
              amax[static_cast<size_t>(c)] < a ? a : amax[static_cast<size_t>(c)];
        }
      }
      for (size_t c = 0; c < amax.size(); ++c) {
        largest = std::max(largest, amax[c]);
        scale[c] = fp8_scale(amax[c], format, margin);
        inverse[c] = 1.0f / scale[c];
      }
      for (int64_t r = r0; r < r0 + nr; ++r) {
        const float* x = in + r * in_stride;
        float* o = out + r * out_stride;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c)
          o[c] = round_to_grid(x[c] * scale[static_cast<size_t>(c)], s.mantissa_bits,
                               s.min_normal_exponent, s.max_finite) *
                 inverse[static_cast<size_t>(c)];
      }
    }
    return largest;
  }
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
