// The f32 -> FP8 conversions and the quantise-dequantise step of kernels/cpu/fp8 against values
// worked by hand from the OCP 8-bit floating point specification (v1.0) and, for many thousands
// of inputs, against tests/torch_ref/check_fp8_cast.py (a brute-force table of every code).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/kernels/cpu/fp8.hpp"

namespace loom {
namespace {

using cpu::Fp8Format;
constexpr Fp8Format kE4M3 = Fp8Format::E4M3;
constexpr Fp8Format kE5M2 = Fp8Format::E5M2;

// Each case: input, the value it rounds to, and its code. E4M3: value = 2^(e-7) (1 + m/8),
// subnormals m/8 2^-6 = m 2^-9; E5M2: 2^(e-15) (1 + m/4), subnormals m 2^-16.
struct Case {
  float input, value;
  uint8_t code;
};

TEST(Fp8Kernels, E4M3ByHand) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {1.0f, 1.0f, 0x38},      // e = 7, m = 0
      {-2.0f, -2.0f, 0xC0},    // sign, e = 8
      {448.0f, 448.0f, 0x7E},  // largest: e = 15, m = 6 (m = 7 is NaN)
      {464.0f, 448.0f, 0x7E},  // halfway to 480, which does not exist: saturates
      {1e6f, 448.0f, 0x7E},    // saturates
      {inf, 448.0f, 0x7E},     // no infinity: saturates
      {-inf, -448.0f, 0xFE},
      {1.0625f, 1.0f, 0x38},   // tie between 1 and 1.125: even mantissa (0)
      {1.1875f, 1.25f, 0x3A},  // tie between 1.125 (m=1) and 1.25 (m=2): to m = 2
      {std::nextafter(1.0625f, 2.0f), 1.125f, 0x39},  // just above the tie
      {0.015625f, 0.015625f, 0x08},                   // 2^-6, smallest normal: e = 1
      {0.001953125f, 0.001953125f, 0x01},             // 2^-9, smallest subnormal
      {0.0009765625f, 0.0f, 0x00},                    // 2^-10: tie between 0 and 2^-9, to 0 (even)
      {std::nextafter(0.0009765625f, 1.0f), 0.001953125f, 0x01},  // just above it
      {0.0029296875f, 0.00390625f, 0x02},  // 3 2^-10: tie between 1 and 2 x 2^-9, to 2
      {-0.0001f, -0.0f, 0x80},             // underflows to a negative zero
      {0.0f, 0.0f, 0x00},
      {-0.0f, -0.0f, 0x80},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(cpu::round_to_fp8(c.input, kE4M3), c.value) << c.input;
    EXPECT_EQ(std::signbit(cpu::round_to_fp8(c.input, kE4M3)), std::signbit(c.value)) << c.input;
    EXPECT_EQ(cpu::fp8_encode(c.input, kE4M3), c.code) << c.input;
  }
  EXPECT_TRUE(std::isnan(cpu::round_to_fp8(std::nanf(""), kE4M3)));
  EXPECT_EQ(cpu::fp8_encode(std::nanf(""), kE4M3), 0x7F);
  EXPECT_TRUE(std::isnan(cpu::fp8_decode(0xFF, kE4M3)));
}

TEST(Fp8Kernels, E5M2ByHand) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {1.0f, 1.0f, 0x3C},          // e = 15
      {57344.0f, 57344.0f, 0x7B},  // largest: e = 30, m = 3
      {61440.0f, 57344.0f, 0x7B},  // halfway to 65536 (the infinity's place): saturates
      {inf, 57344.0f, 0x7B},       // saturating conversion
      {-1e30f, -57344.0f, 0xFB},
      {1.125f, 1.0f, 0x3C},                        // tie between 1 and 1.25: to m = 0
      {1.375f, 1.5f, 0x3E},                        // tie between 1.25 (m=1) and 1.5 (m=2): to m = 2
      {6.103515625e-05f, 6.103515625e-05f, 0x04},  // 2^-14, smallest normal
      {1.52587890625e-05f, 1.52587890625e-05f, 0x01},  // 2^-16, smallest subnormal
      {7.62939453125e-06f, 0.0f, 0x00},                // 2^-17: tie, to 0
      {2.288818359375e-05f, 3.0517578125e-05f, 0x02},  // 3 2^-17: tie between 1 and 2 steps, to 2
  };
  for (const Case& c : cases) {
    EXPECT_EQ(cpu::round_to_fp8(c.input, kE5M2), c.value) << c.input;
    EXPECT_EQ(cpu::fp8_encode(c.input, kE5M2), c.code) << c.input;
  }
  EXPECT_EQ(cpu::fp8_encode(std::nanf(""), kE5M2), 0x7E);
  EXPECT_TRUE(std::isinf(cpu::fp8_decode(0x7C, kE5M2)));
  EXPECT_TRUE(std::isnan(cpu::fp8_decode(0x7D, kE5M2)));
}

// Every finite code decodes to a value that encodes back to it.
TEST(Fp8Kernels, EveryCodeRoundTrips) {
  for (Fp8Format format : {kE4M3, kE5M2})
    for (int code = 0; code < 256; ++code) {
      const float value = cpu::fp8_decode(static_cast<uint8_t>(code), format);
      if (!std::isfinite(value)) continue;
      EXPECT_EQ(cpu::fp8_encode(value, format), code)
          << cpu::fp8_format_name(format) << " " << value;
      EXPECT_EQ(cpu::round_to_fp8(value, format), value);
    }
}

// Many inputs against the brute-force table: every value of both formats, the midpoints between
// neighbours and the floats either side of them, the saturation edges, and log-uniform random
// values from 2^-24 to 2^18 of both signs.
TEST(Fp8Kernels, ConversionMatchesTheBruteForceReference) {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               std::nanf(""),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               1e-45f,
                               1e30f,
                               449.0f,
                               480.0f,
                               57345.0f,
                               65536.0f};
  for (Fp8Format format : {kE4M3, kE5M2}) {
    std::vector<float> values;
    for (int code = 0; code < 128; ++code) {
      const float v = cpu::fp8_decode(static_cast<uint8_t>(code), format);
      if (std::isfinite(v)) values.push_back(v);
    }
    for (size_t i = 0; i < values.size(); ++i) {
      inputs.push_back(values[i]);
      if (i + 1 == values.size()) continue;
      const float mid = 0.5f * (values[i] + values[i + 1]);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
        inputs.push_back(x);
        inputs.push_back(-x);
      }
    }
  }
  CounterRng rng(2026, 14);
  for (uint64_t i = 0; i < 4000; ++i) {
    const double u = static_cast<double>(rng.bits(i) >> 11) / 9007199254740992.0;  // [0, 1)
    const float x = static_cast<float>(std::ldexp(1.0, -24) * std::pow(2.0, 42.0 * u));
    inputs.push_back(i % 2 ? -x : x);
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom_fp8_cast_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/inputs.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(inputs.data()),
             static_cast<std::streamsize>(inputs.size() * sizeof(float)));
  for (Fp8Format format : {kE4M3, kE5M2}) {
    std::vector<uint8_t> codes;
    for (float x : inputs) codes.push_back(cpu::fp8_encode(x, format));
    std::ofstream(dir + "/" + cpu::fp8_format_name(format) + ".u8", std::ios::binary)
        .write(reinterpret_cast<const char*>(codes.data()),
               static_cast<std::streamsize>(codes.size()));
  }
  const std::string command =
      "/usr/bin/python3 " LOOM_SOURCE_DIR "/tests/torch_ref/check_fp8_cast.py " + dir;
  const int status = std::system(command.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0)
      << "check_fp8_cast.py found a mismatch in " << dir;
  std::filesystem::remove_all(dir);
}

// The rounding by its definition, in double: the nearest multiple of the binade's grid step,
// ties to even, saturating at max_finite, NaN kept. kernels/cpu/fp8 rounds by adding and
// subtracting a power of two, so that its loops vectorise; this is what it must equal.
float round_by_definition(float x, Fp8Format format) {
  if (std::isnan(x)) return x;
  const cpu::Fp8Spec s = cpu::fp8_spec(format);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= s.max_finite) return std::copysign(s.max_finite, x);
  if (a == 0) return x;
  const int binade = std::max(std::ilogb(a), s.min_normal_exponent);
  const double step = std::ldexp(1.0, binade - s.mantissa_bits);
  const double q = a / step, whole = std::floor(q);
  const double rounded =
      q - whole > 0.5 || (q - whole == 0.5 && std::fmod(whole, 2.0) != 0) ? whole + 1 : whole;
  return std::copysign(static_cast<float>(rounded * step), x);
}

TEST(Fp8Kernels, RoundingEqualsItsDefinitionAcrossTheFloats) {
  // Every 251st f32 bit pattern (17 million: all exponents, both signs, subnormals, NaNs and
  // infinities), then quantise-dequantise with a scale whose products x * scale must be rounded
  // to f32 before they are rounded to FP8 (no fused multiply-add).
  for (Fp8Format format : {kE4M3, kE5M2}) {
    int64_t wrong = 0;
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 251) {
      const auto bits = static_cast<uint32_t>(b);
      float x;
      std::memcpy(&x, &bits, sizeof x);
      const float got = cpu::round_to_fp8(x, format), want = round_by_definition(x, format);
      const bool same =
          std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, sizeof got) == 0;
      if (!same && ++wrong <= 5)
        ADD_FAILURE() << cpu::fp8_format_name(format) << ": " << x << " rounds to " << got
                      << ", not " << want;
    }
    EXPECT_EQ(wrong, 0);
    CounterRng rng(2026, 36);
    std::vector<float> in(4096), out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const double u = static_cast<double>(rng.bits(i) >> 11) / 9007199254740992.0;
      in[i] = static_cast<float>((i % 2 ? -1 : 1) * std::ldexp(1.0, -20) * std::pow(2.0, 30 * u));
    }
    const float scale = 3.1415927f;
    cpu::quantize_dequantize(out.data(), 64, in.data(), 64, 64, 64, scale, format);
    for (size_t i = 0; i < in.size(); ++i) {
      volatile float product = in[i] * scale;  // rounded to f32 here
      ASSERT_EQ(out[i], round_by_definition(product, format) * (1.0f / scale)) << in[i];
    }
  }
}

TEST(Fp8Kernels, ColumnTilesAreEachTilesOwnScaleAndRounding) {
  // 128 x 1 tiles (down the columns, a band of rows at a time) over a [200, 5] block read with a
  // stride of 7 and written with 6: each tile's amax over its own elements (a NaN not counted),
  // its scale, and each element rounded by the definition. The second band has 72 rows.
  const int64_t rows = 200, cols = 5, in_stride = 7, out_stride = 6;
  std::vector<float> in(static_cast<size_t>(rows * in_stride)),
      out(static_cast<size_t>(rows * out_stride));
  CounterRng rng(2026, 37);
  for (size_t i = 0; i < in.size(); ++i) {
    const double u = static_cast<double>(rng.bits(i) >> 11) / 9007199254740992.0;
    in[i] = static_cast<float>((i % 3 ? 1 : -1) * std::ldexp(1.0, -12) * std::pow(2.0, 20 * u));
  }
  in[3 * in_stride + 2] = std::nanf("");
  for (Fp8Format format : {kE4M3, kE5M2}) {
    const float largest = cpu::quantize_dequantize_tiles(out.data(), out_stride, in.data(),
                                                         in_stride, rows, cols, 128, 1, format, 1);
    float want_largest = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += 128)
      for (int64_t c = 0; c < cols; ++c) {
        float amax = 0;
        for (int64_t r = r0; r < std::min(rows, r0 + 128); ++r) {
          const float a = std::fabs(in[static_cast<size_t>(r * in_stride + c)]);
          if (a > amax) amax = a;
        }
        want_largest = std::max(want_largest, amax);
        const float scale = cpu::fp8_scale(amax, format, 1);
        for (int64_t r = r0; r < std::min(rows, r0 + 128); ++r) {
          volatile float product = in[static_cast<size_t>(r * in_stride + c)] * scale;
          const float want = round_by_definition(product, format) * (1.0f / scale);
          const float got = out[static_cast<size_t>(r * out_stride + c)];
          if (std::isnan(want))
            EXPECT_TRUE(std::isnan(got));
          else
            ASSERT_EQ(got, want) << "row " << r << " column " << c;
        }
      }
    EXPECT_EQ(largest, want_largest);
  }
}

TEST(Fp8Kernels, ScalesAndTiles) {
  // scale = fp8_max / amax / 2^margin (Transformer Engine's formula).
  EXPECT_EQ(cpu::fp8_scale(2.0f, kE4M3, 0), 224.0f);
  EXPECT_EQ(cpu::fp8_scale(2.0f, kE4M3, 1), 112.0f);
  EXPECT_EQ(cpu::fp8_scale(57344.0f, kE5M2, 0), 1.0f);
  EXPECT_EQ(cpu::fp8_scale(0.0f, kE4M3, 0), 1.0f);  // all-zero tensor
  EXPECT_EQ(cpu::fp8_scale(std::numeric_limits<float>::infinity(), kE4M3, 0), 1.0f);
  // 448 / 3e-37 overflows f32: the largest float instead (Transformer Engine's clamp), so a tile
  // of tiny values keeps its zeros (0 x an infinite scale is NaN) and its tiny value codes as
  // 104 (3e-37 x FLT_MAX = 102.1; E4M3's grid in [64, 128) is 8 apart: 96, 104).
  EXPECT_EQ(cpu::fp8_scale(3e-37f, kE4M3, 0), std::numeric_limits<float>::max());
  {
    std::vector<float> tiny = {3e-37f, 0.0f}, q(2);
    cpu::quantize_dequantize_tiles(q.data(), 2, tiny.data(), 2, 1, 2, 1, 128, kE4M3, 0);
    EXPECT_EQ(q[0], 104.0f * (1.0f / std::numeric_limits<float>::max()));
    EXPECT_EQ(q[1], 0.0f);
  }
  // Per tensor: amax 3 -> scale 448/3; 3 maps to 448 and back exactly, 1 to 149.33 -> 144
  // (E4M3's grid in [128, 256) is 16 apart: 144, 160) and back to 144 * 3/448 = 0.96428...
  std::vector<float> x = {3.0f, 1.0f, -0.5f, 0.0f}, out(4);
  const float scale = cpu::fp8_scale(3.0f, kE4M3, 0);
  cpu::quantize_dequantize(out.data(), 4, x.data(), 4, 1, 4, scale, kE4M3);
  const float inverse = 1.0f / scale;
  EXPECT_EQ(out[0], 448.0f * inverse);
  EXPECT_EQ(out[1], 144.0f * inverse);
  EXPECT_EQ(out[2], -72.0f * inverse);  // -74.67 -> -72 (grid 8 apart in [64, 128): 72, 80)
  EXPECT_EQ(out[3], 0.0f);
  // Tiles of 1 x 2 over a [2, 4] block: each tile's own amax maps to 448; a value 1000 times
  // smaller beside a large one in another tile keeps its precision.
  std::vector<float> block = {1000.0f, 3.0f, 0.001f, 0.0003f, 1.0f, 0.0f, -7.0f, 2.0f}, tiled(8);
  const float largest =
      cpu::quantize_dequantize_tiles(tiled.data(), 4, block.data(), 4, 2, 4, 1, 2, kE4M3, 0);
  EXPECT_EQ(largest, 1000.0f);
  EXPECT_EQ(tiled[0], 448.0f * (1.0f / (448.0f / 1000.0f)));
  EXPECT_EQ(tiled[2], 448.0f * (1.0f / (448.0f / 0.001f)));
  // 0.0003 x 448000 = 134.4 -> 128 (grid 16 apart in [128, 256): 128, 144)
  EXPECT_EQ(tiled[3], 128.0f * (1.0f / (448.0f / 0.001f)));
  EXPECT_EQ(tiled[4], 448.0f * (1.0f / 448.0f));
  EXPECT_EQ(tiled[5], 0.0f);
  EXPECT_EQ(tiled[6], -448.0f * (1.0f / 64.0f));  // amax 7: scale 64
  EXPECT_EQ(tiled[7], 128.0f * (1.0f / 64.0f));
}

}  // namespace
}  // namespace loom
