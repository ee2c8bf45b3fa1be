#pragma once
// A stand-in for CUDA's bf16 header under tools/cuda_emulation (see cuda_runtime.h here): the
// storage types and the conversions the kernels use, rounding to nearest even as CUDA's
// __float2bfloat16_rn does (NaN stays NaN, quieted).
#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  uint16_t __x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t wide = uint32_t{b.__x} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x40u)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>(bits >> 16)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
