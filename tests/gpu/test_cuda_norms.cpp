// LayerNorm / RMSNorm (and the fused residual-add variants) against loom::cpu's norms.
// f32: rtol 1e-5 with an absolute floor of 1e-5 x max|want| (same formulas, different
// summation order). bf16: the CPU reference gets the same bf16 inputs in f32; bf16 outputs
// carry one extra rounding (rtol 1e-2, atol 1e-2 x max|want|); f32 statistics and f32 weight
// gradients are computed from identical values and keep 1e-4.
#include <gtest/gtest.h>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/norms.hpp"
#include "loom/kernels/cuda/norms.hpp"

namespace loom::cuda::test {
namespace {

class CudaNormsTest : public CudaTest {};

constexpr int64_t kRows = 150, kDim = 200;  // 5 row chunks for the weight gradients; dim % 32 != 0
constexpr float kEps = 1e-5f;
const size_t kN = static_cast<size_t>(kRows * kDim);

void expect_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                double rtol = 1e-5) {
  expect_close(got, want, rtol, rtol * max_abs(want), what);
}
void expect_bf16(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 1e-2, 1e-2 * max_abs(want), what);
}

// Inputs with a non-zero mean, weights around 1: the shapes real activations have.
struct NormInputs {
  std::vector<float> x = random_vector(kN, 1, -1.0f, 3.0f);
  std::vector<float> weight = random_vector(kDim, 2, 0.5f, 1.5f);
  std::vector<float> bias = random_vector(kDim, 3);
  std::vector<float> d_out = random_vector(kN, 4);
  std::vector<float> d_x0 = random_vector(kN, 5);  // gradients accumulate onto these
  std::vector<float> d_w0 = random_vector(kDim, 6);
  std::vector<float> d_b0 = random_vector(kDim, 7);
  void round_to_bf16() {
    for (auto* v : {&x, &weight, &bias, &d_out, &d_x0}) *v = rounded_to_bf16(*v);
  }
};

TEST_F(CudaNormsTest, LayerNormF32) {
  const NormInputs in;
  std::vector<float> out(kN), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.weight.data(),
                         in.bias.data(), kRows, kDim, kEps);
  DeviceBuffer<float> g_x(in.x), g_w(in.weight), g_b(in.bias), g_out(kN), g_mean(kRows),
      g_rstd(kRows);
  layernorm_forward(g_out.get(), g_mean.get(), g_rstd.get(), g_x.get(), g_w.get(), g_b.get(), kRows,
                    kDim, kEps);
  expect_f32(g_out.download(), out, "out");
  expect_f32(g_mean.download(), mean, "mean");
  expect_f32(g_rstd.download(), rstd, "rstd");

  auto dx = in.d_x0, dw = in.d_w0, db = in.d_b0;
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), in.d_out.data(), in.x.data(),
                          in.weight.data(), mean.data(), rstd.data(), kRows, kDim);
  DeviceBuffer<float> g_dout(in.d_out), g_dx(in.d_x0), g_dw(in.d_w0), g_db(in.d_b0);
  layernorm_backward(g_dx.get(), g_dw.get(), g_db.get(), g_dout.get(), g_x.get(), g_w.get(),
                     g_mean.get(), g_rstd.get(), kRows, kDim);
  expect_f32(g_dx.download(), dx, "d_input");
  expect_f32(g_dw.download(), dw, "d_weight");
  expect_f32(g_db.download(), db, "d_bias");
}

TEST_F(CudaNormsTest, RmsNormF32) {
  const NormInputs in;
  std::vector<float> out(kN), rstd(kRows);
  cpu::rmsnorm_forward(out.data(), rstd.data(), in.x.data(), in.weight.data(), kRows, kDim, kEps);
  DeviceBuffer<float> g_x(in.x), g_w(in.weight), g_out(kN), g_rstd(kRows);
  rmsnorm_forward(g_out.get(), g_rstd.get(), g_x.get(), g_w.get(), kRows, kDim, kEps);
  expect_f32(g_out.download(), out, "out");
  expect_f32(g_rstd.download(), rstd, "rstd");

  auto dx = in.d_x0, dw = in.d_w0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), in.d_out.data(), in.x.data(), in.weight.data(),
                        rstd.data(), kRows, kDim);
  DeviceBuffer<float> g_dout(in.d_out), g_dx(in.d_x0), g_dw(in.d_w0);
  rmsnorm_backward(g_dx.get(), g_dw.get(), g_dout.get(), g_x.get(), g_w.get(), g_rstd.get(), kRows,
                   kDim);
  expect_f32(g_dx.download(), dx, "d_input");
  expect_f32(g_dw.download(), dw, "d_weight");
}

TEST_F(CudaNormsTest, FusedResidualAddNormF32InPlace) {
  const NormInputs in;
  const auto delta = random_vector(kN, 8);
  std::vector<float> sum(kN);
  cpu::add(sum.data(), in.x.data(), delta.data(), static_cast<int64_t>(kN));
  for (const bool layer_norm : {true, false}) {
    SCOPED_TRACE(layer_norm ? "LayerNorm" : "RMSNorm");
    std::vector<float> out(kN), mean(kRows), rstd(kRows);
    if (layer_norm)
      cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), sum.data(), in.weight.data(),
                             in.bias.data(), kRows, kDim, kEps);
    else
      cpu::rmsnorm_forward(out.data(), rstd.data(), sum.data(), in.weight.data(), kRows, kDim,
                           kEps);
    // residual_out aliases residual: the residual stream is updated in place.
    DeviceBuffer<float> g_res(in.x), g_delta(delta), g_w(in.weight), g_b(in.bias);
    DeviceBuffer<float> g_out(kN), g_mean(kRows), g_rstd(kRows);
    if (layer_norm)
      add_layernorm_forward(g_res.get(), g_out.get(), g_mean.get(), g_rstd.get(), g_res.get(),
                            g_delta.get(), g_w.get(), g_b.get(), kRows, kDim, kEps);
    else
      add_rmsnorm_forward(g_res.get(), g_out.get(), g_rstd.get(), g_res.get(), g_delta.get(),
                          g_w.get(), kRows, kDim, kEps);
    expect_close(g_res.download(), sum, 0.0, 0.0, "residual_out (one f32 add: exact)");
    expect_f32(g_out.download(), out, "out");
    expect_f32(g_rstd.download(), rstd, "rstd");
    if (layer_norm) expect_f32(g_mean.download(), mean, "mean");
  }
}

TEST_F(CudaNormsTest, LayerNormBf16) {
  NormInputs in;
  in.round_to_bf16();
  std::vector<float> out(kN), mean(kRows), rstd(kRows);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.weight.data(),
                         in.bias.data(), kRows, kDim, kEps);
  DeviceBuffer<bf16> g_x(to_bf16(in.x)), g_w(to_bf16(in.weight)), g_b(to_bf16(in.bias)), g_out(kN);
  DeviceBuffer<float> g_mean(kRows), g_rstd(kRows);
  layernorm_forward(g_out.get(), g_mean.get(), g_rstd.get(), g_x.get(), g_w.get(), g_b.get(), kRows,
                    kDim, kEps);
  expect_bf16(from_bf16(g_out.download()), out, "out");
  expect_f32(g_mean.download(), mean, "mean", 1e-4);
  expect_f32(g_rstd.download(), rstd, "rstd", 1e-4);

  auto dx = in.d_x0, dw = in.d_w0, db = in.d_b0;
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), in.d_out.data(), in.x.data(),
                          in.weight.data(), mean.data(), rstd.data(), kRows, kDim);
  DeviceBuffer<bf16> g_dout(to_bf16(in.d_out)), g_dx(to_bf16(in.d_x0));
  DeviceBuffer<float> g_dw(in.d_w0), g_db(in.d_b0);
  layernorm_backward(g_dx.get(), g_dw.get(), g_db.get(), g_dout.get(), g_x.get(), g_w.get(),
                     g_mean.get(), g_rstd.get(), kRows, kDim);
  expect_bf16(from_bf16(g_dx.download()), dx, "d_input");
  expect_f32(g_dw.download(), dw, "d_weight", 1e-4);
  expect_f32(g_db.download(), db, "d_bias", 1e-4);
}

TEST_F(CudaNormsTest, RmsNormBf16) {
  NormInputs in;
  in.round_to_bf16();
  std::vector<float> out(kN), rstd(kRows);
  cpu::rmsnorm_forward(out.data(), rstd.data(), in.x.data(), in.weight.data(), kRows, kDim, kEps);
  DeviceBuffer<bf16> g_x(to_bf16(in.x)), g_w(to_bf16(in.weight)), g_out(kN);
  DeviceBuffer<float> g_rstd(kRows);
  rmsnorm_forward(g_out.get(), g_rstd.get(), g_x.get(), g_w.get(), kRows, kDim, kEps);
  expect_bf16(from_bf16(g_out.download()), out, "out");
  expect_f32(g_rstd.download(), rstd, "rstd", 1e-4);

  auto dx = in.d_x0, dw = in.d_w0;
  cpu::rmsnorm_backward(dx.data(), dw.data(), in.d_out.data(), in.x.data(), in.weight.data(),
                        rstd.data(), kRows, kDim);
  DeviceBuffer<bf16> g_dout(to_bf16(in.d_out)), g_dx(to_bf16(in.d_x0));
  DeviceBuffer<float> g_dw(in.d_w0);
  rmsnorm_backward(g_dx.get(), g_dw.get(), g_dout.get(), g_x.get(), g_w.get(), g_rstd.get(), kRows,
                   kDim);
  expect_bf16(from_bf16(g_dx.download()), dx, "d_input");
  expect_f32(g_dw.download(), dw, "d_weight", 1e-4);
}

TEST_F(CudaNormsTest, FusedResidualAddNormBf16) {
  NormInputs in;
  in.round_to_bf16();
  const auto delta = rounded_to_bf16(random_vector(kN, 9));
  std::vector<float> sum(kN);
  cpu::add(sum.data(), in.x.data(), delta.data(), static_cast<int64_t>(kN));
  cpu::round_to_bf16_inplace(sum.data(), static_cast<int64_t>(kN));  // what the device stores
  for (const bool layer_norm : {true, false}) {
    SCOPED_TRACE(layer_norm ? "LayerNorm" : "RMSNorm");
    std::vector<float> out(kN), mean(kRows), rstd(kRows);
    if (layer_norm)
      cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), sum.data(), in.weight.data(),
                             in.bias.data(), kRows, kDim, kEps);
    else
      cpu::rmsnorm_forward(out.data(), rstd.data(), sum.data(), in.weight.data(), kRows, kDim,
                           kEps);
    DeviceBuffer<bf16> g_res(to_bf16(in.x)), g_delta(to_bf16(delta)), g_w(to_bf16(in.weight));
    DeviceBuffer<bf16> g_b(to_bf16(in.bias)), g_res_out(kN), g_out(kN);
    DeviceBuffer<float> g_mean(kRows), g_rstd(kRows);
    if (layer_norm)
      add_layernorm_forward(g_res_out.get(), g_out.get(), g_mean.get(), g_rstd.get(), g_res.get(),
                            g_delta.get(), g_w.get(), g_b.get(), kRows, kDim, kEps);
    else
      add_rmsnorm_forward(g_res_out.get(), g_out.get(), g_rstd.get(), g_res.get(), g_delta.get(),
                          g_w.get(), kRows, kDim, kEps);
    expect_close(from_bf16(g_res_out.download()), sum, 0.0, 0.0,
                 "residual_out (f32 add, RNE: exact)");
    expect_bf16(from_bf16(g_out.download()), out, "out");
    expect_f32(g_rstd.download(), rstd, "rstd", 1e-4);
  }
}

}  // namespace
}  // namespace loom::cuda::test
