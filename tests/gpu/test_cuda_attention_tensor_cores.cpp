// Tensor-core attention (attention_mma.cu) against causal attention computed here in double from
// the same bf16 q|k|v and d_out, on the head widths it takes (64 and 128), with GQA, partial
// tiles and a real model's shape (GPT-2: 1024 tokens, head_dim 64; Llama: head_dim 128, 4 query
// heads per kv head).
//
// Tolerance, element by element, from the roundings the kernels make: each probability (for
// out and dV) and each dS (for dK and dQ) is rounded to bf16 once before its product. Rounding
// to nearest with bf16's 8-bit significand is off by at most half an ulp, 2^-8 of the value at
// the bottom of a binade (2^-9 at its top), so an output may be off by 2^-8 M, where M is the same
// sum over absolute values (M_out = sum_j P_ij |v_j|, M_dV = sum_i P_ij |dO_i|, M_dK = scale sum_i
// |dS_ij| |q_i| with |dS_ij| bounded by P_ij (sum_d |dO_id v_jd| + |D_i|), M_dQ alike over k_j);
// the stored bf16 result adds 2^-8 |want|; f32 accumulation over at most 1024 terms adds
// 2^-14 M. The backward's D_i comes from the GPU's stored output on both sides. The lse is f32
// throughout (exp2 in place of exp, scores summed in another order): 1e-4 relative, as the f32
// kernels' test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/kernels/cuda/attention.hpp"

namespace loom::cuda::test {
namespace {

class TensorCoreAttentionTest : public CudaTest {
 protected:
  void TearDown() override { set_attention_kernel(AttentionKernel::automatic); }
};

constexpr double kBf16Rounding = 1.0 / 256;       // 2^-8: bf16's unit roundoff
constexpr double kF32Accumulation = 1.0 / 16384;  // 2^-14

std::string describe(const AttentionShape& s) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq_len) + " heads " +
         std::to_string(s.heads) + " kv_heads " + std::to_string(s.kv_heads) + " head_dim " +
         std::to_string(s.head_dim);
}

// Exact causal attention of bf16 inputs (in double), with the magnitude sums of the header.
struct Reference {
  std::vector<float> out, lse, d_qkv;
  std::vector<double> out_magnitude, d_qkv_magnitude;
};

// With `out_for_delta`, the backward too, with D_i = dO_i . out_i taken from that output (the
// GPU's stored bf16 one, as the GPU's backward takes it).
Reference reference(const std::vector<float>& qkv, const std::vector<float>& d_out,
                    const AttentionShape& s, const std::vector<float>* out_for_delta) {
  const int64_t T = s.seq_len, D = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t qkv_ld = s.qkv_ld(), out_ld = s.out_ld();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(static_cast<size_t>(s.batch * T * out_ld), 0.0f);
  r.out_magnitude.assign(r.out.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.batch * s.heads * T), 0.0f);
  std::vector<double> d_qkv(static_cast<size_t>(s.batch * T * qkv_ld), 0.0);
  r.d_qkv_magnitude.assign(d_qkv.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t qc = h * D, kc = (s.heads + h / group) * D,
                    vc = (s.heads + s.kv_heads + h / group) * D;
      auto at = [&](int64_t row, int64_t col) { return (b * T + row) * qkv_ld + col; };
      auto out_at = [&](int64_t row, int64_t col) { return (b * T + row) * out_ld + col; };
      for (int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < D; ++c) dot += double(qkv[at(i, qc + c)]) * qkv[at(j, kc + c)];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        r.lse[static_cast<size_t>((b * s.heads + h) * T + i)] =
            static_cast<float>(mx + std::log(sum));
        double delta = 0.0;
        for (int64_t c = 0; c < D; ++c) {
          double o = 0.0, magnitude = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            o += p[j] * qkv[at(j, vc + c)];
            magnitude += p[j] * std::fabs(qkv[at(j, vc + c)]);
          }
          r.out[out_at(i, qc + c)] = static_cast<float>(o);
          r.out_magnitude[out_at(i, qc + c)] = magnitude;
          if (out_for_delta)
            delta += double(d_out[out_at(i, qc + c)]) * (*out_for_delta)[out_at(i, qc + c)];
        }
        if (!out_for_delta) continue;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0, bound = 0.0;
          for (int64_t c = 0; c < D; ++c) {
            const double product = double(d_out[out_at(i, qc + c)]) * qkv[at(j, vc + c)];
            dot += product;
            bound += std::fabs(product);
          }
          const double ds = p[j] * (dot - delta), ds_bound = p[j] * (bound + std::fabs(delta));
          for (int64_t c = 0; c < D; ++c) {
            const double g = d_out[out_at(i, qc + c)];
            d_qkv[at(j, vc + c)] += p[j] * g;
            r.d_qkv_magnitude[at(j, vc + c)] += p[j] * std::fabs(g);
            d_qkv[at(j, kc + c)] += scale * ds * qkv[at(i, qc + c)];
            r.d_qkv_magnitude[at(j, kc + c)] += scale * ds_bound * std::fabs(qkv[at(i, qc + c)]);
            d_qkv[at(i, qc + c)] += scale * ds * qkv[at(j, kc + c)];
            r.d_qkv_magnitude[at(i, qc + c)] += scale * ds_bound * std::fabs(qkv[at(j, kc + c)]);
          }
        }
      }
    }
  r.d_qkv.assign(d_qkv.begin(), d_qkv.end());
  return r;
}

void expect_within_roundings(const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<double>& magnitude, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  size_t failures = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = kBf16Rounding * (magnitude[i] + std::fabs(want[i])) +
                           kF32Accumulation * magnitude[i] + 1e-7;
    const double err = std::fabs(double(got[i]) - want[i]);
    const double ratio = std::isnan(err) ? 1e30 : err / allowed;
    if (ratio > 1.0) ++failures;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(failures, 0u) << what << ": " << failures << " of " << got.size()
                          << " elements beyond their rounding bound; worst at " << worst << ": got "
                          << got[worst] << ", want " << want[worst] << ", " << worst_ratio
                          << "x its bound";
}

const AttentionShape kShapes[] = {
    {2, 70, 4, 4, 64},    // partial second tile, multi-head
    {1, 200, 8, 2, 128},  // four tiles, the last partial; 4 query heads per kv head
    {1, 64, 2, 1, 128},   // exactly one tile, every head on one kv head
    {1, 1024, 4, 4, 64},  // GPT-2's head width at its 1024-token context
    {1, 512, 8, 2, 128},  // Llama 3's head width and grouping
    {1, 130, 2, 2, 64},   // the pipelined forward's 128-row tile and two rows past it
};

// The two tensor-core implementations: attention_mma.cu's, and attention_pipelined.cu's (cp.async
// stages, ldmatrix fragments, 128-row forward tiles at head_dim 64).
const AttentionKernel kTensorCoreKernels[] = {AttentionKernel::tensor_cores,
                                              AttentionKernel::pipelined};
const char* name(AttentionKernel kernel) {
  return kernel == AttentionKernel::pipelined ? "pipelined" : "tensor_cores";
}

TEST_F(TensorCoreAttentionTest, ForwardAndBackwardWithinTheirRoundings) {
  for (const AttentionKernel kernel : kTensorCoreKernels)
    for (const AttentionShape& s : kShapes) {
      SCOPED_TRACE(std::string(name(kernel)) + ": " + describe(s));
      set_attention_kernel(kernel);  // throws if a shape would fall back
      uint32_t seed = 500 + 3 * static_cast<uint32_t>(&s - kShapes);
      const auto qkv = rounded_to_bf16(random_vector(
          static_cast<size_t>(s.batch * s.seq_len * s.qkv_ld()), ++seed, -2.0f, 2.0f));
      const auto d_out = rounded_to_bf16(
          random_vector(static_cast<size_t>(s.batch * s.seq_len * s.out_ld()), ++seed));
      const Reference want = reference(qkv, d_out, s, nullptr);

      DeviceBuffer<bf16> g_qkv(to_bf16(qkv)), g_dout(to_bf16(d_out)), g_out(want.out.size());
      DeviceBuffer<bf16> g_dqkv(to_bf16(random_vector(qkv.size(), ++seed, 1e3f, 2e3f)));
      DeviceBuffer<float> g_lse(want.lse.size());
      cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
      expect_within_roundings(from_bf16(g_out.download()), want.out, want.out_magnitude, "out");
      expect_close(g_lse.download(), want.lse, 1e-4, 1e-5, "lse");
      cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(),
                               s);
      const auto got_out = from_bf16(g_out.download());
      const Reference grads = reference(qkv, d_out, s, &got_out);
      expect_within_roundings(from_bf16(g_dqkv.download()), grads.d_qkv, grads.d_qkv_magnitude,
                              "d_qkv");
    }
}

TEST_F(TensorCoreAttentionTest, AgreesWithTheScalarKernels) {
  const AttentionShape s{1, 300, 4, 2, 64};
  const auto qkv = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.qkv_ld()), 600, -2, 2));
  const auto d_out = to_bf16(random_vector(static_cast<size_t>(s.seq_len * s.out_ld()), 601));
  std::vector<float> results[2];
  for (int k = 0; k < 2; ++k) {
    set_attention_kernel(k == 0 ? AttentionKernel::scalar : AttentionKernel::tensor_cores);
    DeviceBuffer<bf16> g_qkv(qkv), g_dout(d_out), g_out(d_out.size()), g_dqkv(qkv.size());
    DeviceBuffer<float> g_lse(static_cast<size_t>(s.heads * s.seq_len));
    cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
    cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    results[k] = from_bf16(g_out.download());
    const auto d = from_bf16(g_dqkv.download());
    results[k].insert(results[k].end(), d.begin(), d.end());
  }
  // Two kernels, not the same code (so not the same bits), apart by the tensor cores' rounding
  // of P and dS and each one's output rounding: two roundings of the largest value.
  EXPECT_NE(results[0], results[1]);
  expect_close(results[1], results[0], 0.0, 2 * kBf16Rounding * max_abs(results[0]),
               "tensor cores vs scalar");
}

// The pipelined kernels compute the same products as attention_mma.cu's, in the same order per
// element; only where tiles come from differs (and the compiler's fusing of a multiply-add may),
// so, as the scalar comparison above, they agree within two roundings of the largest value.
TEST_F(TensorCoreAttentionTest, PipelinedAgreesWithTheFirstTensorCoreKernels) {
  for (const AttentionShape& s :
       {AttentionShape{2, 300, 4, 2, 64}, AttentionShape{1, 200, 8, 2, 128}}) {
    SCOPED_TRACE(describe(s));
    const auto qkv =
        to_bf16(random_vector(static_cast<size_t>(s.batch * s.seq_len * s.qkv_ld()), 610, -2, 2));
    const auto d_out =
        to_bf16(random_vector(static_cast<size_t>(s.batch * s.seq_len * s.out_ld()), 611));
    std::vector<float> out[2], d_qkv[2];
    for (int k = 0; k < 2; ++k) {
      set_attention_kernel(kTensorCoreKernels[k]);
      DeviceBuffer<bf16> g_qkv(qkv), g_dout(d_out), g_out(d_out.size()), g_dqkv(qkv.size());
      DeviceBuffer<float> g_lse(static_cast<size_t>(s.batch * s.heads * s.seq_len));
      cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
      cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(),
                               s);
      out[k] = from_bf16(g_out.download());
      d_qkv[k] = from_bf16(g_dqkv.download());
    }
    expect_close(out[1], out[0], 0.0, 2 * kBf16Rounding * max_abs(out[0]), "out");
    expect_close(d_qkv[1], d_qkv[0], 0.0, 2 * kBf16Rounding * max_abs(d_qkv[0]), "d_qkv");
  }
}

TEST_F(TensorCoreAttentionTest, BackwardIsDeterministic) {
  for (const AttentionKernel kernel : kTensorCoreKernels) {
    SCOPED_TRACE(name(kernel));
    set_attention_kernel(kernel);
    const AttentionShape s{2, 200, 8, 2, 128};
    DeviceBuffer<bf16> g_qkv(
        to_bf16(random_vector(static_cast<size_t>(2 * 200 * s.qkv_ld()), 700))),
        g_dout(to_bf16(random_vector(static_cast<size_t>(2 * 200 * s.out_ld()), 701)));
    DeviceBuffer<bf16> g_out(g_dout.size()), first(g_qkv.size()), second(g_qkv.size());
    DeviceBuffer<float> g_lse(static_cast<size_t>(2 * 8 * 200));
    cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
    cuda::attention_backward(first.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    cuda::attention_backward(second.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
    const auto a = first.download(), b = second.download();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)));
  }
}

TEST_F(TensorCoreAttentionTest, SelectionAndRefusals) {
  DeviceBuffer<bf16> buf(1 << 16);
  DeviceBuffer<float> lse(1 << 10);
  EXPECT_EQ(tensor_cores_refusal({1, 8, 2, 2, 64}, {buf.get()}), "");
  EXPECT_NE(tensor_cores_refusal({1, 8, 2, 2, 80}, {buf.get()}).find("head_dim 80"),
            std::string::npos);
  EXPECT_NE(tensor_cores_refusal({1, 8, 2, 2, 64}, {buf.get() + 1}).find("16-byte"),
            std::string::npos);
  // automatic: a head width the tensor cores do not take runs on the scalar kernels.
  set_attention_kernel(AttentionKernel::automatic);
  EXPECT_NO_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}));
  set_attention_kernel(AttentionKernel::tensor_cores);
  EXPECT_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}), Error);
  set_attention_kernel(AttentionKernel::pipelined);
  EXPECT_THROW(cuda::attention_forward(buf.get(), lse.get(), buf.get(), {1, 8, 2, 2, 80}), Error);
}

}  // namespace
}  // namespace loom::cuda::test
