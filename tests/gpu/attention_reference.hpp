#pragma once
// Causal attention computed in double from bf16 q|k|v and d_out, with the magnitude sums that
// bound each output's rounding error, for the tests of the bf16 attention kernels
// (test_cuda_attention_tensor_cores.cpp: loom's tensor-core kernels; test_cuda_attention_cudnn.cpp:
// cuDNN's). The tolerance's derivation is in the first of those files' header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/kernels/cuda/attention.hpp"

namespace loom::cuda::test {

inline constexpr double kBf16Rounding = 1.0 / 256;       // 2^-8: bf16's unit roundoff
inline constexpr double kF32Accumulation = 1.0 / 16384;  // 2^-14

inline std::string describe(const AttentionShape& s) {
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
inline Reference reference(const std::vector<float>& qkv, const std::vector<float>& d_out,
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

inline void expect_within_roundings(const std::vector<float>& got, const std::vector<float>& want,
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

// Runs the current kernels' forward and backward on random bf16 inputs (from `seed`) and expects
// out, lse and d_qkv within their roundings of the double reference; d_qkv starts poisoned, so
// that a gradient the kernels did not write shows.
inline void expect_forward_backward_within_roundings(const AttentionShape& s, uint32_t seed) {
  const auto qkv = rounded_to_bf16(
      random_vector(static_cast<size_t>(s.batch * s.seq_len * s.qkv_ld()), ++seed, -2.0f, 2.0f));
  const auto d_out =
      rounded_to_bf16(random_vector(static_cast<size_t>(s.batch * s.seq_len * s.out_ld()), ++seed));
  const Reference want = reference(qkv, d_out, s, nullptr);

  DeviceBuffer<bf16> g_qkv(to_bf16(qkv)), g_dout(to_bf16(d_out)), g_out(want.out.size());
  DeviceBuffer<bf16> g_dqkv(to_bf16(random_vector(qkv.size(), ++seed, 1e3f, 2e3f)));
  DeviceBuffer<float> g_lse(want.lse.size());
  cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
  expect_within_roundings(from_bf16(g_out.download()), want.out, want.out_magnitude, "out");
  expect_close(g_lse.download(), want.lse, 1e-4, 1e-5, "lse");
  cuda::attention_backward(g_dqkv.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
  const auto got_out = from_bf16(g_out.download());
  const Reference grads = reference(qkv, d_out, s, &got_out);
  expect_within_roundings(from_bf16(g_dqkv.download()), grads.d_qkv, grads.d_qkv_magnitude,
                          "d_qkv");
}

// Runs the current kernels' forward once and their backward twice on the same inputs (random,
// from `seed`) and expects the same bits from both backward passes.
inline void expect_backward_deterministic(const AttentionShape& s, uint32_t seed) {
  const size_t rows = static_cast<size_t>(s.batch * s.seq_len);
  DeviceBuffer<bf16> g_qkv(to_bf16(random_vector(rows * static_cast<size_t>(s.qkv_ld()), seed))),
      g_dout(to_bf16(random_vector(rows * static_cast<size_t>(s.out_ld()), seed + 1)));
  DeviceBuffer<bf16> g_out(g_dout.size()), first(g_qkv.size()), second(g_qkv.size());
  DeviceBuffer<float> g_lse(static_cast<size_t>(s.batch * s.heads * s.seq_len));
  cuda::attention_forward(g_out.get(), g_lse.get(), g_qkv.get(), s);
  cuda::attention_backward(first.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
  cuda::attention_backward(second.get(), g_dout.get(), g_qkv.get(), g_out.get(), g_lse.get(), s);
  const auto a = first.download(), b = second.download();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)));
}

}  // namespace loom::cuda::test
