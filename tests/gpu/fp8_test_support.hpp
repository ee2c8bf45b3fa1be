#pragma once
// What the FP8 GPU tests share (test_cuda_fp8.cpp, test_cuda_fp8_blockwise.cpp): the bounds an
// FP8 product on the device is held to against the CPU, the exact product of dequantised values,
// and host tensors of bf16 values moved to the device.
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/core/tensor.hpp"

namespace loom::cuda::test {

inline constexpr double kBf16Rounding = 1.0 / 256;
// Worst-case relative error of a k-term f32 sum with a few roundings around it, of sum |terms|
// (the CPU side: OpenBLAS's f32 GEMM over the dequantised values).
inline double accumulation(int64_t k) { return (k + 4) * std::ldexp(1.0, -24); }
// FP8 tensor cores do not accumulate in IEEE f32: Hopper's FP8 MMA keeps about 14 bits in its
// accumulator between cuBLASLt's promotions to f32 (DeepSeek-V3, arXiv 2412.19437, section
// 3.3.2; cublasLt.h's CUBLASLT_MATMUL_DESC_FAST_ACCUM: intermediate results "periodically
// promoted"), so a product over k <= 256 terms may be off by 2^-13 of sum |terms| for each of
// at most two promotion intervals (block-scaled products promote every 128 terms).
inline constexpr double kFp8Accumulation = 1.0 / 4096;  // 2^-12

// want[i, j] = sum_q a[i, q] b[j, q] + start[i, j] in double (rounded to f32), and
// magnitude[i, j] = sum_q |a[i, q] b[j, q]| + |start[i, j]|: a [m, k], b [n, k] row-major.
struct ExactProduct {
  std::vector<float> want;
  std::vector<double> magnitude;
};
inline ExactProduct exact_product(const std::vector<float>& a, const std::vector<float>& b,
                                  const std::vector<float>& start, int64_t m, int64_t n,
                                  int64_t k) {
  ExactProduct p{std::vector<float>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t q = 0; q < k; ++q) {
        const double product = double(a[i * k + q]) * b[j * k + q];
        sum += product;
        abs_sum += std::fabs(product);
      }
      p.want[i * n + j] = static_cast<float>(sum + start[i * n + j]);
      p.magnitude[i * n + j] = abs_sum + std::fabs(start[i * n + j]);
    }
  return p;
}

inline Tensor host_tensor(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  std::memcpy(t.f32(), values.data(), values.size() * sizeof(float));
  return t;
}
inline Tensor on_gpu_bf16(const Tensor& host) {
  Tensor t = Tensor::empty(host.shape(), DType::BF16, MemCategory::Workspace, Device::CUDA);
  t.copy_from(host);  // converts: the values are bf16 already, so exactly
  return t;
}

}  // namespace loom::cuda::test
