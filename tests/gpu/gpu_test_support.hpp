#pragma once
// Shared pieces of the GPU tests: a fixture that skips on machines without a CUDA device (so
// ctest reports "Skipped", never "Passed"), device buffers, random inputs, bf16 rounding and
// a tolerance check that names the worst element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_info.hpp"

namespace loom::cuda::test {

using bf16 = __nv_bfloat16;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_info().count == 0) GTEST_SKIP() << "no CUDA device: not run";
  }
};

// Owns n elements of device memory; filled from and read back into host vectors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) LOOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), n_);
    LOOM_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // surfaces asynchronous kernel faults here
    std::vector<T> host(n_);
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Host-side bf16 with loom's own rounding (round to nearest even), bit-identical to
// __float2bfloat16_rn on the device.
inline bf16 to_bf16(float x) {
  __nv_bfloat16_raw raw;
  raw.x = f32_to_bf16(x);
  return bf16(raw);
}
inline float from_bf16(bf16 x) { return bf16_to_f32(static_cast<__nv_bfloat16_raw>(x).x); }
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_bf16(v[i]);
  return out;
}
// The f32 values a bf16 tensor holds: what the CPU reference is fed in the bf16 tests.
inline std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

// |got - want| <= atol + rtol * |want| for every element; on failure names the worst one.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                         double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0, failures = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = atol + rtol * std::fabs(static_cast<double>(want[i]));
    const double excess = std::isnan(err) ? 1e30 : err - allowed;
    if (excess > 0) ++failures;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << got.size()
                          << " elements outside tolerance (rtol " << rtol << ", atol " << atol
                          << "); worst at " << worst << ": got " << got[worst] << ", want "
                          << want[worst];
}

// Largest |x|, for absolute tolerances that scale with the data.
inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace loom::cuda::test
