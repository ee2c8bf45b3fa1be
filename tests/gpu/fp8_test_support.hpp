#pragma once
// What the FP8 GPU tests share (test_cuda_fp8.cpp, test_cuda_fp8_blockwise.cpp): the bounds an
// FP8 product on the device is held to against the CPU, the exact product of dequantised values,
// and host tensors of bf16 values moved to the device.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/core/tensor.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/model/linear.hpp"

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

// One FP8 Linear (with a bias of bf16 values) on each device under the same recipe: the CPU's
// emulation in f32 and the device's codes in bf16. A step feeds both the same bf16 values (x
// [rows, in], the weight [out, in], an output gradient [rows, wide] read from column `col`),
// writes columns [col, col + out) of a wide output, runs the backward and closes the step.
struct Fp8LinearPair {
  struct Step {
    std::vector<float> want_out, got_out, want_dx, got_dx, want_dw, got_dw, want_db, got_db;
  };
  Linear cpu, gpu;
  std::shared_ptr<Fp8Context> cpu_context = std::make_shared<Fp8Context>(),
                              gpu_context = std::make_shared<Fp8Context>();
  std::unique_ptr<Fp8Training> cpu_training, gpu_training;
  Tensor bias;  // host, bf16 values
  int64_t in, out;

  Fp8LinearPair(int64_t in_features, int64_t out_features, Fp8Recipe recipe)
      : cpu("l", in_features, out_features, true, false),
        gpu("l", in_features, out_features, true, false),
        in(in_features),
        out(out_features) {
    cpu_context->config.recipe = gpu_context->config.recipe = recipe;
    cpu_training = std::make_unique<Fp8Training>(
        cpu_context, std::vector<Fp8Linear*>{cpu.enable_fp8(cpu_context)});
    gpu_training = std::make_unique<Fp8Training>(
        gpu_context, std::vector<Fp8Linear*>{gpu.enable_fp8(gpu_context)});
    bias = host_tensor(rounded_to_bf16(random_vector(out, 3, -0.1f, 0.1f)), {out});
    cpu.bias.value.copy_from(bias);
    gpu.bias.value = on_gpu_bf16(bias);
    gpu.weight.grad = Tensor::zeros({out, in}, DType::F32, MemCategory::Workspace, Device::CUDA);
    gpu.bias.grad = Tensor::zeros({out}, DType::F32, MemCategory::Workspace, Device::CUDA);
  }

  Step step(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& g,
            int64_t rows, int64_t wide, int64_t col) {
    const Tensor hx = host_tensor(x, {rows, in}), hw = host_tensor(w, {out, in}),
                 hg = host_tensor(g, {rows, wide});
    cpu.weight.value.copy_from(hw);
    gpu.weight.value = on_gpu_bf16(hw);
    cpu.weight.grad.zero_(), cpu.bias.grad.zero_();
    gpu.weight.grad.zero_(), gpu.bias.grad.zero_();
    Tensor cpu_out = Tensor::zeros({rows, wide}, DType::F32, MemCategory::Workspace);
    Tensor gpu_out = Tensor::zeros({rows, wide}, DType::BF16, MemCategory::Workspace, Device::CUDA);
    Tensor cpu_dx = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
    Tensor gpu_dx = Tensor::zeros({rows, in}, DType::BF16, MemCategory::Workspace, Device::CUDA);
    const Tensor gx = on_gpu_bf16(hx), gg = on_gpu_bf16(hg);
    cpu_training->begin_step(), gpu_training->begin_step();
    cpu.forward(cpu_out, col, hx);
    gpu.forward(gpu_out, col, gx);
    cpu.backward(cpu_dx, false, hg, col, hx);
    gpu.backward(gpu_dx, false, gg, col, gx);
    cpu_training->finish_step(true), gpu_training->finish_step(true);
    return {cpu_out.to_f32_vector(),         gpu_out.to_f32_vector(),
            cpu_dx.to_f32_vector(),          gpu_dx.to_f32_vector(),
            cpu.weight.grad.to_f32_vector(), gpu.weight.grad.to_f32_vector(),
            cpu.bias.grad.to_f32_vector(),   gpu.bias.grad.to_f32_vector()};
  }
};

}  // namespace loom::cuda::test
