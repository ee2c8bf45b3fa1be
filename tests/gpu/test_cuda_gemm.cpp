// cuBLASLt products against loom::cpu's OpenBLAS ones. f32: CUBLAS_COMPUTE_32F (no TF32), so
// the only difference is summation order: rtol 1e-4 with an absolute floor of 1e-4 x max|want|.
// bf16 operands: the CPU reference gets the same bf16-rounded values in f32, so f32 results
// (weight and bias gradients) keep the f32 tolerance; bf16 results add one bf16 rounding
// (relative 2^-9): rtol 1e-2, atol 1e-2 x max|want|. Every linear test runs twice: with
// cuBLASLt's bias epilogues and with loom's fallback bias kernels.
#include <gtest/gtest.h>

#include <cmath>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cuda/cublas_context.hpp"
#include "loom/kernels/cuda/gemm.hpp"

namespace loom::cuda::test {
namespace {

constexpr double kF32Rtol = 1e-4, kBf16Rtol = 1e-2;

class CudaGemmTest : public CudaTest {
 protected:
  void TearDown() override { set_bias_epilogues_enabled(true); }
};

void expect_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, kF32Rtol, kF32Rtol * max_abs(want), what);
}
void expect_bf16(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, kBf16Rtol, kBf16Rtol * max_abs(want), what);
}

// Row-major storage sizes of op(A) [m,k] and op(B) [k,n] with padded leading dimensions.
// Odd sizes everywhere; f32 also gets odd leading dimensions. bf16 rows are padded to whole
// 16-byte multiples, as every real layer's are, so a missing odd-stride bf16 algorithm in
// cuBLASLt cannot fail the test for a reason unrelated to loom.
struct GemmCase {
  bool ta, tb;
  bool bf16_strides = false;
  int64_t m = 37, n = 45, k = 29;
  int64_t pad(int64_t rows, int64_t f32_pad) const {
    return bf16_strides ? (rows + 8 + 7) / 8 * 8 : rows + f32_pad;
  }
  int64_t lda() const { return pad(ta ? m : k, 3); }
  int64_t ldb() const { return pad(tb ? k : n, 5); }
  int64_t ldc() const { return pad(n, 2); }
  size_t a_size() const { return static_cast<size_t>((ta ? k : m) * lda()); }
  size_t b_size() const { return static_cast<size_t>((tb ? n : k) * ldb()); }
  size_t c_size() const { return static_cast<size_t>(m * ldc()); }
};

TEST_F(CudaGemmTest, F32MatchesCpuForEveryTransposition) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "transpose_a " << ta << " transpose_b " << tb);
      const GemmCase g{ta, tb};
      const auto a = random_vector(g.a_size(), 1), b = random_vector(g.b_size(), 2);
      auto want = random_vector(g.c_size(), 3);
      DeviceBuffer<float> da(a), db(b), dc(want);
      gemm(ta, tb, g.m, g.n, g.k, 0.7f, da.get(), g.lda(), db.get(), g.ldb(), 0.3f, dc.get(),
           g.ldc());
      cpu::sgemm(ta, tb, g.m, g.n, g.k, 0.7f, a.data(), g.lda(), b.data(), g.ldb(), 0.3f,
                 want.data(), g.ldc());
      expect_f32(dc.download(), want, "C");
    }
}

TEST_F(CudaGemmTest, Bf16OperandsWithF32AndBf16Results) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "transpose_a " << ta << " transpose_b " << tb);
      const GemmCase g{ta, tb, true};
      const auto a = rounded_to_bf16(random_vector(g.a_size(), 4));
      const auto b = rounded_to_bf16(random_vector(g.b_size(), 5));
      const auto c0 = rounded_to_bf16(random_vector(g.c_size(), 6));
      auto want = c0;
      cpu::sgemm(ta, tb, g.m, g.n, g.k, 1.0f, a.data(), g.lda(), b.data(), g.ldb(), 1.0f,
                 want.data(), g.ldc());
      DeviceBuffer<bf16> da(to_bf16(a)), db(to_bf16(b)), dc16(to_bf16(c0));
      DeviceBuffer<float> dc32(c0);
      gemm(ta, tb, g.m, g.n, g.k, 1.0f, da.get(), g.lda(), db.get(), g.ldb(), 1.0f, dc32.get(),
           g.ldc());
      gemm(ta, tb, g.m, g.n, g.k, 1.0f, da.get(), g.lda(), db.get(), g.ldb(), 1.0f, dc16.get(),
           g.ldc());
      expect_f32(dc32.download(), want, "f32 C");
      expect_bf16(from_bf16(dc16.download()), want, "bf16 C");
    }
}

// A linear layer writing its columns into the middle of a wider fused buffer (as q|k|v do),
// so the output pointer is not 256-byte aligned and out_ld > out_features.
struct LinearCase {
  int64_t n = 33, in = 48, out = 40;
  int64_t out_ld = 40 + 24, out_offset = 8;  // columns [8, 48) of 64
};

TEST_F(CudaGemmTest, LinearForwardF32) {
  for (const bool epilogue : {true, false})
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "bias epilogue " << epilogue << " bias " << with_bias);
      set_bias_epilogues_enabled(epilogue);
      const LinearCase c;
      const auto input = random_vector(static_cast<size_t>(c.n * c.in), 7);
      const auto weight = random_vector(static_cast<size_t>(c.out * c.in), 8);
      const auto bias = random_vector(static_cast<size_t>(c.out), 9);
      auto want = random_vector(static_cast<size_t>(c.n * c.out_ld), 10);  // other columns kept
      DeviceBuffer<float> d_input(input), d_weight(weight), d_bias(bias), d_out(want);
      linear_forward(d_out.get() + c.out_offset, c.out_ld, d_input.get(), d_weight.get(),
                     with_bias ? d_bias.get() : nullptr, c.n, c.in, c.out);
      cpu::linear_forward(want.data() + c.out_offset, c.out_ld, input.data(), weight.data(),
                          with_bias ? bias.data() : nullptr, c.n, c.in, c.out);
      expect_f32(d_out.download(), want, "out");
    }
}

TEST_F(CudaGemmTest, LinearBackwardF32) {
  for (const bool epilogue : {true, false})
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "bias epilogue " << epilogue << " accumulate " << accumulate);
      set_bias_epilogues_enabled(epilogue);
      const LinearCase c;
      const auto input = random_vector(static_cast<size_t>(c.n * c.in), 11);
      const auto weight = random_vector(static_cast<size_t>(c.out * c.in), 12);
      const auto d_out = random_vector(static_cast<size_t>(c.n * c.out_ld), 13);
      auto want_dx = random_vector(static_cast<size_t>(c.n * c.in), 14);
      auto want_dw = random_vector(static_cast<size_t>(c.out * c.in), 15);
      auto want_db = random_vector(static_cast<size_t>(c.out), 16);
      DeviceBuffer<float> g_input(input), g_weight(weight), g_dout(d_out);
      DeviceBuffer<float> g_dx(want_dx), g_dw(want_dw), g_db(want_db);
      linear_backward(g_dx.get(), accumulate, g_dw.get(), g_db.get(), g_dout.get() + c.out_offset,
                      c.out_ld, g_input.get(), g_weight.get(), c.n, c.in, c.out);
      cpu::linear_backward(want_dx.data(), accumulate, want_dw.data(), want_db.data(),
                           d_out.data() + c.out_offset, c.out_ld, input.data(), weight.data(), c.n,
                           c.in, c.out);
      expect_f32(g_dx.download(), want_dx, "d_input");
      expect_f32(g_dw.download(), want_dw, "d_weight");
      expect_f32(g_db.download(), want_db, "d_bias");
    }
}

TEST_F(CudaGemmTest, LinearBackwardBiasWithoutWeightGradient) {
  const LinearCase c;
  const auto d_out = random_vector(static_cast<size_t>(c.n * c.out), 17);
  auto want_db = random_vector(static_cast<size_t>(c.out), 18);
  DeviceBuffer<float> g_dout(d_out), g_db(want_db);
  DeviceBuffer<float> unused_input(static_cast<size_t>(c.n * c.in)),
      unused_weight(static_cast<size_t>(c.out * c.in));
  linear_backward(nullptr, false, nullptr, g_db.get(), g_dout.get(), c.out, unused_input.get(),
                  unused_weight.get(), c.n, c.in, c.out);
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t j = 0; j < c.out; ++j) want_db[j] += d_out[r * c.out + j];
  expect_f32(g_db.download(), want_db, "d_bias");
}

TEST_F(CudaGemmTest, LinearBf16ForwardAndBackward) {
  for (const bool epilogue : {true, false}) {
    SCOPED_TRACE(testing::Message() << "bias epilogue " << epilogue);
    set_bias_epilogues_enabled(epilogue);
    const LinearCase c;
    const auto input = rounded_to_bf16(random_vector(static_cast<size_t>(c.n * c.in), 19));
    const auto weight = rounded_to_bf16(random_vector(static_cast<size_t>(c.out * c.in), 20));
    const auto bias = rounded_to_bf16(random_vector(static_cast<size_t>(c.out), 21));
    const auto out0 = rounded_to_bf16(random_vector(static_cast<size_t>(c.n * c.out_ld), 22));
    DeviceBuffer<bf16> g_input(to_bf16(input)), g_weight(to_bf16(weight)), g_bias(to_bf16(bias));
    DeviceBuffer<bf16> g_out(to_bf16(out0));
    linear_forward(g_out.get() + c.out_offset, c.out_ld, g_input.get(), g_weight.get(),
                   g_bias.get(), c.n, c.in, c.out);
    auto want_out = out0;
    cpu::linear_forward(want_out.data() + c.out_offset, c.out_ld, input.data(), weight.data(),
                        bias.data(), c.n, c.in, c.out);
    expect_bf16(from_bf16(g_out.download()), want_out, "out");

    const auto d_out = rounded_to_bf16(random_vector(static_cast<size_t>(c.n * c.out_ld), 23));
    auto want_dx = rounded_to_bf16(random_vector(static_cast<size_t>(c.n * c.in), 24));
    auto want_dw = random_vector(static_cast<size_t>(c.out * c.in), 25);
    auto want_db = random_vector(static_cast<size_t>(c.out), 26);
    DeviceBuffer<bf16> g_dout(to_bf16(d_out)), g_dx(to_bf16(want_dx));
    DeviceBuffer<float> g_dw(want_dw), g_db(want_db);
    linear_backward(g_dx.get(), true, g_dw.get(), g_db.get(), g_dout.get() + c.out_offset, c.out_ld,
                    g_input.get(), g_weight.get(), c.n, c.in, c.out);
    cpu::linear_backward(want_dx.data(), true, want_dw.data(), want_db.data(),
                         d_out.data() + c.out_offset, c.out_ld, input.data(), weight.data(), c.n,
                         c.in, c.out);
    expect_bf16(from_bf16(g_dx.download()), want_dx, "d_input");
    expect_f32(g_dw.download(), want_dw, "d_weight");
    expect_f32(g_db.download(), want_db, "d_bias");
  }
}

// GPT-2's tanh GELU (HF "gelu_new") and its derivative, in double.
double gelu(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) +
         0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

// The MLP's fused GELU epilogues against the same products and GELU in double. Bounds, element
// by element, with M the sum of the absolute products (|x||w| summed, plus |b|): pre is one
// bf16 rounding of an f32 sum (2^-8 |pre| + 2^-14 M); act is gelu of the f32 sum, rounded
// (2^-8 |act|), with cuBLASLt's tanh allowed an error of 2^-8 (0.5 |pre| 2^-8), since its GELU's
// tanh is not documented to be exact; d_pre is gelu'(pre) times an f32 sum, rounded (2^-8
// |d_pre| + 2^-14 |gelu'| M), with the same tanh allowance through gelu', whose dependence on
// tanh is at most 0.5 + |x| |u'(x)| <= 16 for |x| <= 4 (2^-8 x 16 |d_out W|): inputs are scaled
// so every pre-activation stays within 4. Below M a wrong index or a missing bias is O(1).
// One forward product of [n, in] by [out, in] with the GELU epilogue and one backward product
// through a second layer [out2, out], checked on every `row_step`-th row.
void check_gelu_epilogues(int64_t n, int64_t in, int64_t out, int64_t out2, int64_t row_step,
                          uint32_t seed) {
  SCOPED_TRACE(testing::Message() << n << " x " << in << " -> " << out << " -> " << out2);
  const int64_t ld = out + 8;  // a multiple of 8, as cuBLASLt needs
  // Weights scaled with 1 / sqrt(in): each pre-activation has a standard deviation of about 0.5
  // whatever in is, plus a bias within 0.5, so the largest of 10^5 stays well within 4.
  const float w1_range = 0.15f * std::sqrt(96.0f / static_cast<float>(in));
  auto input = rounded_to_bf16(random_vector(static_cast<size_t>(n * in), seed));
  auto weight =
      rounded_to_bf16(random_vector(static_cast<size_t>(out * in), seed + 1, -w1_range, w1_range));
  auto bias = rounded_to_bf16(random_vector(static_cast<size_t>(out), seed + 2, -0.5f, 0.5f));
  DeviceBuffer<bf16> g_input(to_bf16(input)), g_weight(to_bf16(weight)), g_bias(to_bf16(bias));
  DeviceBuffer<bf16> g_act(static_cast<size_t>(n * ld)), g_pre(static_cast<size_t>(n * ld));
  ASSERT_TRUE(linear_gelu_forward(g_act.get(), g_pre.get(), ld, g_input.get(), g_weight.get(),
                                  g_bias.get(), n, in, out))
      << "cuBLASLt has no GELU_AUX_BIAS kernel for a bf16 " << n << "x" << out << "x" << in
      << " product";
  const auto act = from_bf16(g_act.download()), pre = from_bf16(g_pre.download());
  size_t failures = 0;
  for (int64_t r = 0; r < n; r += row_step)
    for (int64_t j = 0; j < out; ++j) {
      double sum = bias[static_cast<size_t>(j)], magnitude = std::fabs(sum);
      for (int64_t c = 0; c < in; ++c) {
        const double product = double(input[static_cast<size_t>(r * in + c)]) *
                               weight[static_cast<size_t>(j * in + c)];
        sum += product, magnitude += std::fabs(product);
      }
      ASSERT_LE(std::fabs(sum), 4.0) << "the inputs' scale leaves the bounded range";
      const size_t at = static_cast<size_t>(r * ld + j);
      const double pre_bound = std::fabs(sum) / 256 + magnitude / 16384;
      const double act_bound = std::fabs(gelu(sum)) / 256 + 0.5 * std::fabs(sum) / 256 + pre_bound;
      if (std::fabs(pre[at] - sum) > pre_bound || std::fabs(act[at] - gelu(sum)) > act_bound)
        ++failures;
    }
  EXPECT_EQ(failures, 0u) << "pre / act elements beyond their bounds";

  // Backward through the second product: d_pre = gelu'(pre) * (d_out @ W2).
  auto w2 =
      rounded_to_bf16(random_vector(static_cast<size_t>(out2 * out), seed + 3, -0.25f, 0.25f));
  auto d_out = rounded_to_bf16(random_vector(static_cast<size_t>(n * out2), seed + 4));
  DeviceBuffer<bf16> g_w2(to_bf16(w2)), g_dout(to_bf16(d_out));
  DeviceBuffer<bf16> g_dpre(static_cast<size_t>(n * ld));
  ASSERT_TRUE(
      gelu_input_grad(g_dpre.get(), ld, g_dout.get(), out2, g_w2.get(), g_pre.get(), n, out, out2))
      << "cuBLASLt has no DGELU kernel for a bf16 " << n << "x" << out << "x" << out2 << " product";
  const auto d_pre = from_bf16(g_dpre.download());
  failures = 0;
  for (int64_t r = 0; r < n; r += row_step)
    for (int64_t j = 0; j < out; ++j) {
      double d_act = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < out2; ++c) {
        const double product =
            double(d_out[static_cast<size_t>(r * out2 + c)]) * w2[static_cast<size_t>(c * out + j)];
        d_act += product, magnitude += std::fabs(product);
      }
      const size_t at = static_cast<size_t>(r * ld + j);
      const double slope = gelu_grad(pre[at]), want = slope * d_act;
      const double bound = std::fabs(want) / 256 + std::fabs(slope) * magnitude / 16384 +
                           16 * std::fabs(d_act) / 256;
      if (std::fabs(d_pre[at] - want) > bound) ++failures;
    }
  EXPECT_EQ(failures, 0u) << "d_pre elements beyond their bounds";

  // With the epilogues switched off both decline, and write nothing.
  set_bias_epilogues_enabled(false);
  EXPECT_FALSE(linear_gelu_forward(g_act.get(), g_pre.get(), ld, g_input.get(), g_weight.get(),
                                   g_bias.get(), n, in, out));
  EXPECT_FALSE(
      gelu_input_grad(g_dpre.get(), ld, g_dout.get(), out2, g_w2.get(), g_pre.get(), n, out, out2));
  set_bias_epilogues_enabled(true);
}

TEST_F(CudaGemmTest, GeluEpiloguesMatchTheTwoKernelPath) {
  check_gelu_epilogues(64, 96, 136, 72, 1, 40);  // odd widths, every row
  // GPT-2 124M's MLP at 16 x 1024 tokens (16384 x 768 -> 3072 -> 768), every 512th row.
  check_gelu_epilogues(16384, 768, 3072, 768, 512, 50);
}

TEST_F(CudaGemmTest, HeuristicRunsOncePerProductAndCachedPlansGiveTheSameResult) {
  // A product no other test uses (odd sizes), run three times, then with another shape.
  const int64_t m = 37, n = 53, k = 29;
  const auto a = random_vector(m * k, 90), b = random_vector(k * n, 91);
  DeviceBuffer<float> ga(a), gb(b), gc(m * n), gd(m * n);
  const MatmulPlanStats before = matmul_plan_stats();
  gemm(false, false, m, n, k, 1.0f, ga.get(), k, gb.get(), n, 0.0f, gc.get(), n);
  const MatmulPlanStats first = matmul_plan_stats();
  EXPECT_EQ(first.misses, before.misses + 1);
  EXPECT_EQ(first.plans, before.plans + 1);
  gemm(false, false, m, n, k, 1.0f, ga.get(), k, gb.get(), n, 0.0f, gd.get(), n);
  gemm(false, false, m, n, k, 2.0f, ga.get(), k, gb.get(), n, 0.0f, gd.get(), n);  // alpha only
  const MatmulPlanStats cached = matmul_plan_stats();
  EXPECT_EQ(cached.misses, first.misses);
  EXPECT_EQ(cached.hits, first.hits + 2);
  auto twice = gc.download();
  for (float& x : twice) x *= 2.0f;  // exact in f32
  EXPECT_EQ(gd.download(), twice);
  gemm(false, false, m, n, k - 1, 1.0f, ga.get(), k, gb.get(), n, 0.0f, gc.get(), n);
  EXPECT_EQ(matmul_plan_stats().misses, cached.misses + 1);  // another shape, another plan
}

}  // namespace
}  // namespace loom::cuda::test
