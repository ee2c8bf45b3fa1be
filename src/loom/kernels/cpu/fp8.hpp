#pragma once
// FP8 number formats, emulated in f32: exact round-to-nearest-even conversion from f32 to the
// two formats of the OCP 8-bit floating point specification (v1.0, 2023) that Hopper's tensor
// cores take, their 8-bit codes, and the quantise-dequantise step of FP8 training
// (q(x) = fp8(x * scale) / scale) per tensor or per tile. The CPU trains FP8 by running its f32
// GEMMs on these dequantised values, so a CUDA path fed the same scales and codes gives the same
// products up to the order of its f32 accumulation.
#include <cstdint>

namespace loom::cpu {

// E4M3 ("e4m3fn"): bias 7, 3 mantissa bits, no infinities, one NaN pattern per sign (S.1111.111),
// largest 448 = 1.75 x 2^8, smallest normal 2^-6, subnormal step 2^-9.
// E5M2: bias 15, 2 mantissa bits, IEEE-like (infinities, NaNs), largest 57344 = 1.75 x 2^15,
// smallest normal 2^-14, subnormal step 2^-16.
enum class Fp8Format { E4M3, E5M2 };

struct Fp8Spec {
  int mantissa_bits;
  int exponent_bias;
  int min_normal_exponent;  // of the smallest normal, 1 - bias
  float max_finite;
};
Fp8Spec fp8_spec(Fp8Format format);
const char* fp8_format_name(Fp8Format format);

// The f32 value of x rounded to the nearest value of the format, ties to even mantissa;
// saturating: anything at or beyond the largest finite value (infinities too) becomes it, with
// x's sign (NVIDIA's __NV_SATFINITE conversion); NaN stays NaN.
float round_to_fp8(float x, Fp8Format format);
// The 8-bit code of round_to_fp8(x) and back (sign, exponent, mantissa as the spec packs them).
uint8_t fp8_encode(float x, Fp8Format format);
float fp8_decode(uint8_t code, Fp8Format format);

// Largest |x| over n values (0 for n = 0); NaN if any value is NaN.
float abs_max(const float* x, int64_t n);
// The scale that maps amax onto the format's largest value, divided by 2^margin
// (Transformer Engine's delayed-scaling formula); 1 when amax is zero or not finite, so an all-
// zero tensor stays zero and a bad amax does not poison the scale; FLT_MAX where the quotient
// overflows (an amax below about 1e-36).
float fp8_scale(float amax, Fp8Format format, int margin);

// out[r, c] = round_to_fp8(in[r, c] * scale) * (1 / scale) for a [rows, cols] block whose rows
// are `in_stride` and `out_stride` floats apart (in and out may alias).
void quantize_dequantize(float* out, int64_t out_stride, const float* in, int64_t in_stride,
                         int64_t rows, int64_t cols, float scale, Fp8Format format);
// The same per tile of tile_rows x tile_cols (edge tiles smaller), each with its own scale from
// its own amax (DeepSeek-V3's fine-grained quantisation: 1 x 128 activation tiles, 128 x 128
// weight blocks). Returns the largest tile amax.
float quantize_dequantize_tiles(float* out, int64_t out_stride, const float* in, int64_t in_stride,
                                int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                                Fp8Format format, int margin);

}  // namespace loom::cpu
