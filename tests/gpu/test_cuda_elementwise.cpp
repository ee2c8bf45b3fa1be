// Vector helpers, dtype conversion, embedding and AdamW against loom::cpu. Pointwise f32 ops
// are single IEEE operations on both sides: exact. sum_of_squares: both in double, relative
// 1e-12. Embedding backward (atomicAdd order) and AdamW (FMA contraction may differ):
// rtol 1e-5 with an absolute floor of 1e-6 x max|want|. The multi-tensor AdamW and the
// per-tensor kernel: exact (one arithmetic per element).
#include <gtest/gtest.h>

#include <bit>
#include <memory>
#include <string>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/adamw.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/kernels/cuda/adamw.hpp"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/embedding.hpp"

namespace loom::cuda::test {
namespace {

class CudaElementwiseTest : public CudaTest {};

constexpr int64_t kN = 5000;

void expect_exact(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 0.0, 0.0, what);
}
void expect_f32(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  expect_close(got, want, 1e-5, 1e-6 * max_abs(want), what);
}

TEST_F(CudaElementwiseTest, AddScaleF32AreExact) {
  const auto a = random_vector(kN, 1), b = random_vector(kN, 2);
  std::vector<float> sum(kN), acc = a, scaled = a;
  cpu::add(sum.data(), a.data(), b.data(), kN);
  cpu::add_into(acc.data(), b.data(), kN);
  cpu::scale_inplace(scaled.data(), 0.37f, kN);
  DeviceBuffer<float> ga(a), gb(b), gsum(kN), gacc(a), gscaled(a);
  add(gsum.get(), ga.get(), gb.get(), kN);
  add_into(gacc.get(), gb.get(), kN);
  scale_inplace(gscaled.get(), 0.37f, kN);
  expect_exact(gsum.download(), sum, "add");
  expect_exact(gacc.download(), acc, "add_into");
  expect_exact(gscaled.download(), scaled, "scale_inplace");
}

TEST_F(CudaElementwiseTest, AddScaleBf16RoundOnce) {
  const auto a = rounded_to_bf16(random_vector(kN, 3)), b = rounded_to_bf16(random_vector(kN, 4));
  std::vector<float> sum(kN), scaled = a;
  cpu::add(sum.data(), a.data(), b.data(), kN);
  cpu::round_to_bf16_inplace(sum.data(), kN);
  cpu::scale_inplace(scaled.data(), 0.37f, kN);
  cpu::round_to_bf16_inplace(scaled.data(), kN);
  DeviceBuffer<bf16> ga(to_bf16(a)), gb(to_bf16(b)), gsum(kN), gacc(to_bf16(a)),
      gscaled(to_bf16(a));
  add(gsum.get(), ga.get(), gb.get(), kN);
  add_into(gacc.get(), gb.get(), kN);
  scale_inplace(gscaled.get(), 0.37f, kN);
  expect_exact(from_bf16(gsum.download()), sum, "add");
  expect_exact(from_bf16(gacc.download()), sum, "add_into");
  expect_exact(from_bf16(gscaled.download()), scaled, "scale_inplace");
}

TEST_F(CudaElementwiseTest, SumOfSquaresIsAccurateAndDeterministic) {
  const int64_t n = 1'000'003;  // more elements than the fixed grid has threads
  const auto x = random_vector(static_cast<size_t>(n), 5, -3.0f, 3.0f);
  DeviceBuffer<float> gx(x);
  const double want = cpu::sum_of_squares(x.data(), n);
  const double first = sum_of_squares(gx.get(), n), second = sum_of_squares(gx.get(), n);
  EXPECT_NEAR(first, want, 1e-12 * want);
  EXPECT_EQ(first, second) << "same input, same bits";
  EXPECT_EQ(sum_of_squares(gx.get(), 0), 0.0);
}

TEST_F(CudaElementwiseTest, SumsOfSquaresEqualTheSingleCallsBitForBit) {
  const std::vector<int64_t> sizes = {1000, 0, 70001, 3};
  std::vector<std::unique_ptr<DeviceBuffer<float>>> buffers;
  std::vector<const float*> pointers;
  std::vector<double> want;
  uint32_t seed = 40;
  for (int64_t n : sizes) {
    buffers.push_back(std::make_unique<DeviceBuffer<float>>(
        random_vector(static_cast<size_t>(std::max<int64_t>(n, 1)), ++seed, -3.0f, 3.0f)));
    pointers.push_back(buffers.back()->get());
    want.push_back(sum_of_squares(buffers.back()->get(), n));
  }
  EXPECT_EQ(want[1], 0.0);
  std::vector<double> got(sizes.size(), -1.0);
  sums_of_squares(got.data(), pointers.data(), sizes.data(), static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(got, want);  // the same kernels in the same order: the same bits, empty ones 0
}

TEST_F(CudaElementwiseTest, Bf16ConversionsMatchHostRounding) {
  auto x = random_vector(kN, 6, -1000.0f, 1000.0f);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = 1.0f + 1.0f / 256.0f;  // a tie: rounds to even
  DeviceBuffer<float> gx(x), back(kN), rounded(x);
  DeviceBuffer<bf16> g16(kN);
  convert(g16.get(), gx.get(), kN);
  convert(back.get(), g16.get(), kN);
  round_to_bf16_inplace(rounded.get(), kN);
  const auto want = rounded_to_bf16(x);
  expect_exact(from_bf16(g16.download()), want, "f32 -> bf16");
  expect_exact(back.download(), want, "bf16 -> f32");
  expect_exact(rounded.download(), want, "round_to_bf16_inplace");
}

// Embedding with repeated tokens (the backward scatter must add, not overwrite).
constexpr int64_t kBatch = 3, kSeq = 11, kDim = 40, kVocab = 17;

std::vector<int32_t> tokens_with_repeats() {
  std::vector<int32_t> tokens(static_cast<size_t>(kBatch * kSeq));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7) % 5 + (i % 3) * 4);
  return tokens;
}

TEST_F(CudaElementwiseTest, EmbeddingF32) {
  const auto tokens = tokens_with_repeats();
  const auto tok_table = random_vector(static_cast<size_t>(kVocab * kDim), 7);
  const auto pos_table = random_vector(static_cast<size_t>(kSeq * kDim), 8);
  const auto d_out = random_vector(static_cast<size_t>(kBatch * kSeq * kDim), 9);
  DeviceBuffer<int32_t> g_tokens(tokens);
  DeviceBuffer<float> g_tok(tok_table), g_pos(pos_table), g_dout(d_out);
  for (const bool positions : {true, false}) {
    SCOPED_TRACE(positions ? "with positions" : "tokens only");
    std::vector<float> out(d_out.size());
    auto d_tok = random_vector(tok_table.size(), 10), d_pos = random_vector(pos_table.size(), 11);
    DeviceBuffer<float> g_out(out.size()), g_dtok(d_tok), g_dpos(d_pos);
    cpu::embedding_forward(out.data(), tokens.data(), tok_table.data(),
                           positions ? pos_table.data() : nullptr, kBatch, kSeq, kDim);
    cpu::embedding_backward(d_tok.data(), positions ? d_pos.data() : nullptr, d_out.data(),
                            tokens.data(), kBatch, kSeq, kDim);
    embedding_forward(g_out.get(), g_tokens.get(), g_tok.get(), positions ? g_pos.get() : nullptr,
                      kBatch, kSeq, kDim);
    embedding_backward(g_dtok.get(), positions ? g_dpos.get() : nullptr, g_dout.get(),
                       g_tokens.get(), kBatch, kSeq, kDim);
    expect_exact(g_out.download(), out, "embedding");
    expect_f32(g_dtok.download(), d_tok, "d_token_table");
    expect_f32(g_dpos.download(), d_pos, "d_position_table");
  }
}

TEST_F(CudaElementwiseTest, EmbeddingBf16) {
  const auto tokens = tokens_with_repeats();
  const auto tok_table = rounded_to_bf16(random_vector(static_cast<size_t>(kVocab * kDim), 12));
  const auto pos_table = rounded_to_bf16(random_vector(static_cast<size_t>(kSeq * kDim), 13));
  const auto d_out = rounded_to_bf16(random_vector(static_cast<size_t>(kBatch * kSeq * kDim), 14));
  std::vector<float> out(d_out.size()), d_tok(tok_table.size(), 0.0f),
      d_pos(pos_table.size(), 0.0f);
  // The device gradients start from the same zeros; both sides accumulate into them.
  DeviceBuffer<float> g_dtok(d_tok), g_dpos(d_pos);
  cpu::embedding_forward(out.data(), tokens.data(), tok_table.data(), pos_table.data(), kBatch,
                         kSeq, kDim);
  cpu::round_to_bf16_inplace(out.data(), static_cast<int64_t>(out.size()));
  cpu::embedding_backward(d_tok.data(), d_pos.data(), d_out.data(), tokens.data(), kBatch, kSeq,
                          kDim);
  DeviceBuffer<int32_t> g_tokens(tokens);
  DeviceBuffer<bf16> g_tok(to_bf16(tok_table)), g_pos(to_bf16(pos_table)), g_dout(to_bf16(d_out));
  DeviceBuffer<bf16> g_out(out.size());
  embedding_forward(g_out.get(), g_tokens.get(), g_tok.get(), g_pos.get(), kBatch, kSeq, kDim);
  embedding_backward(g_dtok.get(), g_dpos.get(), g_dout.get(), g_tokens.get(), kBatch, kSeq, kDim);
  expect_exact(from_bf16(g_out.download()), out, "embedding (one rounding of tok + pos)");
  expect_f32(g_dtok.download(), d_tok, "d_token_table");
  expect_f32(g_dpos.download(), d_pos, "d_position_table");
}

TEST_F(CudaElementwiseTest, AdamWMatchesCpuOverSeveralSteps) {
  auto param = random_vector(kN, 15), m = std::vector<float>(kN, 0.0f), v = m;
  DeviceBuffer<float> g_param(param), g_m(m), g_v(v), g_grad(kN);
  DeviceBuffer<bf16> g_param16(kN);
  for (int64_t step = 1; step <= 3; ++step) {
    const auto grad = random_vector(kN, 16 + static_cast<uint32_t>(step));
    g_grad.upload(grad);
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f};
    cpu::adamw_update(param.data(), grad.data(), m.data(), v.data(), kN, s);
    adamw_update(g_param.get(), g_param16.get(), g_grad.get(), g_m.get(), g_v.get(), kN, s);
  }
  const auto got = g_param.download();
  expect_f32(got, param, "param");
  expect_f32(g_m.download(), m, "exp_avg");
  expect_f32(g_v.download(), v, "exp_avg_sq");
  expect_exact(from_bf16(g_param16.download()), rounded_to_bf16(got), "bf16 copy = rounded master");
}

std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::bit_cast<uint32_t>(x[i]);
  return out;
}

// The multi-tensor AdamW over three steps against the per-tensor kernel (the same arithmetic
// per element: bit for bit) and the CPU (the tolerance above). Sizes around the kernel's
// 4-float groups and 4096-element tiles, an empty tensor, bf16 copies on some, a weight decay
// per tensor (the optimizer's decay groups) and two tensors at unaligned addresses (its
// element-by-element path). Guard elements before (the unaligned ones) and after each tensor
// must come through untouched.
TEST_F(CudaElementwiseTest, AdamWManyEqualsThePerTensorKernelBitForBit) {
  struct Case {
    int64_t n, offset;  // elements; guards before them
    bool copy;          // with a bf16 copy
  };
  const std::vector<Case> cases = {{1, 0, true},     {3, 0, false},   {1000, 0, true},
                                   {4097, 0, false}, {0, 0, true},    {8195, 1, true},
                                   {5, 2, false},    {12288, 0, true}};
  constexpr float kGuard = 7.0f;
  const auto padded = [&](const std::vector<float>& x, const Case& c) {
    std::vector<float> out(static_cast<size_t>(c.offset), kGuard);
    out.insert(out.end(), x.begin(), x.end());
    out.push_back(kGuard);
    return out;
  };
  const auto inner = [&](const std::vector<float>& x, const Case& c) {
    return std::vector<float>(x.begin() + c.offset, x.begin() + c.offset + c.n);
  };
  const size_t count = cases.size();
  using Floats = std::unique_ptr<DeviceBuffer<float>>;
  using Bf16s = std::unique_ptr<DeviceBuffer<bf16>>;
  std::vector<std::vector<float>> param(count), m(count), v(count);  // the CPU's
  std::vector<Floats> grad(count), param1(count), m1(count), v1(count), param_many(count),
      m_many(count), v_many(count);
  std::vector<Bf16s> copy1(count), copy_many(count);
  for (size_t t = 0; t < count; ++t) {
    const Case& c = cases[t];
    const auto n = static_cast<size_t>(c.n);
    const auto seed = static_cast<uint32_t>(100 + 10 * t);
    param[t] = random_vector(n, seed);
    m[t] = random_vector(n, seed + 1, -0.1f, 0.1f);
    v[t] = random_vector(n, seed + 2, 0.0f, 0.1f);
    for (Floats* buffers : {&param1[t], &param_many[t]})
      *buffers = std::make_unique<DeviceBuffer<float>>(padded(param[t], c));
    for (Floats* buffers : {&m1[t], &m_many[t]})
      *buffers = std::make_unique<DeviceBuffer<float>>(padded(m[t], c));
    for (Floats* buffers : {&v1[t], &v_many[t]})
      *buffers = std::make_unique<DeviceBuffer<float>>(padded(v[t], c));
    grad[t] = std::make_unique<DeviceBuffer<float>>(n + static_cast<size_t>(c.offset) + 1);
    if (c.copy)
      for (Bf16s* buffers : {&copy1[t], &copy_many[t]})
        *buffers =
            std::make_unique<DeviceBuffer<bf16>>(to_bf16(padded(std::vector<float>(n, 0.0f), c)));
  }
  // Case t's first element in a buffer (null for a missing bf16 copy).
  const auto at = [&](const auto& buffer, size_t t) {
    return buffer ? buffer->get() + cases[t].offset : nullptr;
  };
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<AdamWTensor> many;
    for (size_t t = 0; t < count; ++t) {
      const Case& c = cases[t];
      const auto g =
          random_vector(static_cast<size_t>(c.n), static_cast<uint32_t>(1000 + 10 * step + t));
      grad[t]->upload(padded(g, c));
      const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, t % 2 == 0 ? 0.1f : 0.0f, step, 0.5f};
      cpu::adamw_update(param[t].data(), g.data(), m[t].data(), v[t].data(), c.n, s);
      // Qualified: ADL also finds cpu::adamw_update, whose arguments these also fit.
      if (c.copy)
        cuda::adamw_update(at(param1[t], t), at(copy1[t], t), at(grad[t], t), at(m1[t], t),
                           at(v1[t], t), c.n, s);
      else
        cuda::adamw_update(at(param1[t], t), at(grad[t], t), at(m1[t], t), at(v1[t], t), c.n, s);
      many.push_back({at(param_many[t], t), at(copy_many[t], t), at(grad[t], t), at(m_many[t], t),
                      at(v_many[t], t), c.n, s});
    }
    cuda::adamw_update_many(many.data(), static_cast<int64_t>(many.size()));
  }
  for (size_t t = 0; t < count; ++t) {
    const Case& c = cases[t];
    SCOPED_TRACE("tensor " + std::to_string(t) + " of " + std::to_string(c.n) + " elements" +
                 (c.offset ? ", unaligned" : "") + (c.copy ? ", bf16 copy" : ""));
    const auto got = param_many[t]->download(), got_m = m_many[t]->download(),
               got_v = v_many[t]->download();
    // The whole buffers, guards included: equal to the per-tensor kernel's, which leaves them.
    EXPECT_EQ(bits(got), bits(param1[t]->download())) << "param";
    EXPECT_EQ(bits(got_m), bits(m1[t]->download())) << "exp_avg";
    EXPECT_EQ(bits(got_v), bits(v1[t]->download())) << "exp_avg_sq";
    for (const auto* buffer : {&got, &got_m, &got_v}) {
      for (int64_t i = 0; i < c.offset; ++i) EXPECT_EQ((*buffer)[static_cast<size_t>(i)], kGuard);
      EXPECT_EQ(buffer->back(), kGuard);
    }
    expect_f32(inner(got, c), param[t], "param");
    expect_f32(inner(got_m, c), m[t], "exp_avg");
    expect_f32(inner(got_v, c), v[t], "exp_avg_sq");
    if (c.copy) {
      const auto copy = from_bf16(copy_many[t]->download());
      EXPECT_EQ(bits(copy), bits(from_bf16(copy1[t]->download()))) << "bf16 copy";
      expect_exact(inner(copy, c), rounded_to_bf16(inner(got, c)), "bf16 copy = rounded master");
      for (int64_t i = 0; i < c.offset; ++i) EXPECT_EQ(copy[static_cast<size_t>(i)], kGuard);
      EXPECT_EQ(copy.back(), kGuard);
    }
  }
}

}  // namespace
}  // namespace loom::cuda::test
