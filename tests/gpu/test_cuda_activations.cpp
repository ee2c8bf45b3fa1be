// GELU, SwiGLU and RoPE against loom::cpu. f32: rtol 1e-5 with an absolute floor of
// 1e-6 x max|want| (the CPU uses ~2-ulp polynomial exp/tanh, the GPU libdevice's expf/tanhf).
// bf16: same inputs for both (bf16 values in f32), one output rounding: rtol 1e-2,
// atol 1e-2 x max|want|.
#include <gtest/gtest.h>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/rope.hpp"
#include "loom/kernels/cuda/activations.hpp"
#include "loom/kernels/cuda/rope.hpp"

namespace loom::cuda::test {
namespace {

class CudaActivationsTest : public CudaTest {};

void expect_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 1e-5, 1e-6 * max_abs(want), what);
}
void expect_bf16(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 1e-2, 1e-2 * max_abs(want), what);
}

constexpr size_t kN = 3000;

TEST_F(CudaActivationsTest, GeluF32) {
  const auto x = random_vector(kN, 1, -6.0f, 6.0f), d_out = random_vector(kN, 2);
  std::vector<float> y(kN), dx(kN);
  cpu::gelu_forward(y.data(), x.data(), kN);
  cpu::gelu_backward(dx.data(), d_out.data(), x.data(), kN);
  DeviceBuffer<float> g_x(x), g_dout(d_out), g_y(kN), g_dx(kN);
  gelu_forward(g_y.get(), g_x.get(), kN);
  gelu_backward(g_dx.get(), g_dout.get(), g_x.get(), kN);
  expect_f32(g_y.download(), y, "gelu");
  // The backward cancels: 1 + tanh(u) and 1 - tanh(u)^2 for x near -4 subtract from 1 a tanh
  // that either side knows to about 2 ulps of 1 (2 x 2^-23), and the second is multiplied by
  // 0.5 x d_inner (1 - t) <= |x| d_inner; over |x| <= 6 that bounds the absolute error of
  // d_input by (0.5 + 6 x 0.798 x (1 + 3 x 0.044715 x 36)) x 2 x 2^-23 x max|d_out|, about
  // 6.8e-6 x max|d_out| (GPU and CPU measured 1.9e-6 apart at x = -4.2 on an H100).
  const double cancel = (0.5 + 6.0 * 0.7978845608 * (1.0 + 3.0 * 0.044715 * 36.0)) * 2.0 *
                        std::ldexp(1.0, -23) * max_abs(d_out);
  expect_close(g_dx.download(), dx, 1e-5, cancel, "gelu backward");
}

TEST_F(CudaActivationsTest, GeluBf16) {
  const auto x = rounded_to_bf16(random_vector(kN, 3, -6.0f, 6.0f));
  const auto d_out = rounded_to_bf16(random_vector(kN, 4));
  std::vector<float> y(kN), dx(kN);
  cpu::gelu_forward(y.data(), x.data(), kN);
  cpu::gelu_backward(dx.data(), d_out.data(), x.data(), kN);
  DeviceBuffer<bf16> g_x(to_bf16(x)), g_dout(to_bf16(d_out)), g_y(kN), g_dx(kN);
  gelu_forward(g_y.get(), g_x.get(), kN);
  gelu_backward(g_dx.get(), g_dout.get(), g_x.get(), kN);
  expect_bf16(from_bf16(g_y.download()), y, "gelu");
  expect_bf16(from_bf16(g_dx.download()), dx, "gelu backward");
}

// gate | up side by side in one fused [rows, 2 * dim] buffer, as the MLP's projection writes them.
constexpr int64_t kRows = 30, kDim = 70, kLd = 2 * kDim;

TEST_F(CudaActivationsTest, SwigluF32) {
  const auto fused = random_vector(static_cast<size_t>(kRows * kLd), 5, -5.0f, 5.0f);
  const auto d_out = random_vector(static_cast<size_t>(kRows * kDim), 6);
  std::vector<float> y(static_cast<size_t>(kRows * kDim)), d_fused(fused.size());
  cpu::swiglu_forward(y.data(), fused.data(), fused.data() + kDim, kRows, kDim, kLd);
  cpu::swiglu_backward(d_fused.data(), d_fused.data() + kDim, d_out.data(), fused.data(),
                       fused.data() + kDim, kRows, kDim, kLd);
  DeviceBuffer<float> g_fused(fused), g_dout(d_out), g_y(y.size()), g_dfused(fused.size());
  swiglu_forward(g_y.get(), g_fused.get(), g_fused.get() + kDim, kRows, kDim, kLd);
  swiglu_backward(g_dfused.get(), g_dfused.get() + kDim, g_dout.get(), g_fused.get(),
                  g_fused.get() + kDim, kRows, kDim, kLd);
  expect_f32(g_y.download(), y, "swiglu");
  expect_f32(g_dfused.download(), d_fused, "swiglu backward (d_gate | d_up)");
}

TEST_F(CudaActivationsTest, SwigluBf16) {
  const auto fused =
      rounded_to_bf16(random_vector(static_cast<size_t>(kRows * kLd), 7, -5.0f, 5.0f));
  const auto d_out = rounded_to_bf16(random_vector(static_cast<size_t>(kRows * kDim), 8));
  std::vector<float> y(static_cast<size_t>(kRows * kDim)), d_fused(fused.size());
  cpu::swiglu_forward(y.data(), fused.data(), fused.data() + kDim, kRows, kDim, kLd);
  cpu::swiglu_backward(d_fused.data(), d_fused.data() + kDim, d_out.data(), fused.data(),
                       fused.data() + kDim, kRows, kDim, kLd);
  DeviceBuffer<bf16> g_fused(to_bf16(fused)), g_dout(to_bf16(d_out)), g_y(y.size()),
      g_dfused(fused.size());
  swiglu_forward(g_y.get(), g_fused.get(), g_fused.get() + kDim, kRows, kDim, kLd);
  swiglu_backward(g_dfused.get(), g_dfused.get() + kDim, g_dout.get(), g_fused.get(),
                  g_fused.get() + kDim, kRows, kDim, kLd);
  expect_bf16(from_bf16(g_y.download()), y, "swiglu");
  expect_bf16(from_bf16(g_dfused.download()), d_fused, "swiglu backward (d_gate | d_up)");
}

// RoPE on the q and k heads of a fused q|k|v buffer (v must stay untouched), forward and the
// inverse rotation the backward pass uses.
constexpr int64_t kBatch = 2, kSeq = 19, kHeads = 4, kKvHeads = 2, kHeadDim = 16;
constexpr int64_t kQkvLd = (kHeads + 2 * kKvHeads) * kHeadDim;

TEST_F(CudaActivationsTest, RopeF32AndBf16) {
  const cpu::RopeTable table = cpu::make_rope_table(kHeadDim, 32, 10000.0);
  const RopeTableDevice device_table(table);
  for (const bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    const auto x = rounded_to_bf16(random_vector(static_cast<size_t>(kBatch * kSeq * kQkvLd), 9));
    auto want = x;
    // q heads, then the k heads that follow them: heads + kv_heads heads from column 0.
    cpu::rope_apply(want.data(), kBatch, kSeq, kHeads + kKvHeads, kQkvLd, table, inverse);
    DeviceBuffer<float> g32(x);
    rope_apply(g32.get(), kBatch, kSeq, kHeads + kKvHeads, kQkvLd, device_table, inverse);
    expect_f32(g32.download(), want, "rope f32");
    DeviceBuffer<bf16> g16(to_bf16(x));
    rope_apply(g16.get(), kBatch, kSeq, kHeads + kKvHeads, kQkvLd, device_table, inverse);
    expect_bf16(from_bf16(g16.download()), want, "rope bf16");
  }
}

TEST_F(CudaActivationsTest, RopeRejectsSequencesLongerThanTheTable) {
  const RopeTableDevice device_table(cpu::make_rope_table(kHeadDim, 8, 10000.0));
  DeviceBuffer<float> x(static_cast<size_t>(kSeq * kQkvLd));
  EXPECT_THROW(rope_apply(x.get(), 1, kSeq, kHeads, kQkvLd, device_table, false), Error);
}

}  // namespace
}  // namespace loom::cuda::test
