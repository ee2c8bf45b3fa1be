#pragma once
// Element types and devices. bf16 is stored as the upper 16 bits of an IEEE f32 and
// converted with round-to-nearest-even, the same rounding PyTorch and CUDA use.
#include <cstdint>
#include <cstring>
#include <string>

namespace loom {

enum class DType : uint8_t { F32, BF16 };
enum class Device : uint8_t { CPU, CUDA };

inline size_t dtype_size_bytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType dtype) { return dtype == DType::F32 ? "f32" : "bf16"; }
inline const char* device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float bf16_to_f32(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// Rounds an f32 to the nearest bf16 value, kept in f32 storage.
inline float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

}  // namespace loom
