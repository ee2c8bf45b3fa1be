#pragma once
// Branch-free exp and tanh that GCC vectorises inside `omp simd` loops (glibc's expf/tanhf
// are scalar calls and cost more than the GEMMs around them in GELU and softmax).
// exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6 polynomial
// for e^r (Taylor coefficients; truncation error < 2e-8 on that interval) and 2^n built in
// the exponent bits. Relative error about 2 ulp on [-87, 88]; inputs are clamped to that range.
#include <cstdint>
#include <cstring>

namespace loom::cpu {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;     // ln2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  // Round to nearest by the 1.5 * 2^23 trick: branch-free and vectorisable, unlike roundf.
  constexpr float kRoundMagic = 12582912.0f;
  const float n = (x * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1); for |x| > 9 tanh is 1 to f32 precision.
#pragma omp declare simd notinbranch
inline float fast_tanh(float x) {
  x = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

}  // namespace loom::cpu
