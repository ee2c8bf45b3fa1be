// Gradient checks of every CPU kernel against central finite differences, plus forward checks
// against naive reference formulas (attention, cross-entropy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradcheck.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/adamw.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cpu/norms.hpp"
#include "loom/kernels/cpu/rope.hpp"

namespace loom::test {
namespace {

TEST(KernelGrad, Linear) {
  const int64_t n = 5, in = 7, out = 6;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2), b = random_vector(out, 3);
  auto probe = random_vector(n * out, 4);
  auto loss = [&] {
    std::vector<float> y(n * out);
    cpu::linear_forward(y.data(), out, x.data(), w.data(), b.data(), n, in, out);
    return dot(y, probe);
  };
  std::vector<float> dx(n * in), dw(out * in, 0.0f), db(out, 0.0f);
  cpu::linear_backward(dx.data(), false, dw.data(), db.data(), probe.data(), out, x.data(), w.data(),
                       n, in, out);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(w, dw, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(b, db, loss), kGradCheckTolerance);
}

TEST(KernelGrad, LayerNorm) {
  const int64_t rows = 4, dim = 16;
  auto x = random_vector(rows * dim, 5), w = random_vector(dim, 6), b = random_vector(dim, 7);
  auto probe = random_vector(rows * dim, 8);
  std::vector<float> mean(rows), rstd(rows);
  auto loss = [&] {
    std::vector<float> y(rows * dim);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
    return dot(y, probe);
  };
  loss();
  std::vector<float> dx(rows * dim, 0.0f), dw(dim, 0.0f), db(dim, 0.0f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), probe.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), rows, dim);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(w, dw, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(b, db, loss), kGradCheckTolerance);
}

TEST(KernelGrad, RMSNorm) {
  const int64_t rows = 4, dim = 16;
  auto x = random_vector(rows * dim, 9), w = random_vector(dim, 10);
  auto probe = random_vector(rows * dim, 11);
  std::vector<float> rstd(rows);
  auto loss = [&] {
    std::vector<float> y(rows * dim);
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    return dot(y, probe);
  };
  loss();
  std::vector<float> dx(rows * dim, 0.0f), dw(dim, 0.0f);
  cpu::rmsnorm_backward(dx.data(), dw.data(), probe.data(), x.data(), w.data(), rstd.data(), rows, dim);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(w, dw, loss), kGradCheckTolerance);
}

TEST(KernelGrad, Gelu) {
  const int64_t n = 64;
  auto x = random_vector(n, 12, 2.0f), probe = random_vector(n, 13);
  auto loss = [&] {
    std::vector<float> y(n);
    cpu::gelu_forward(y.data(), x.data(), n);
    return dot(y, probe);
  };
  std::vector<float> dx(n);
  cpu::gelu_backward(dx.data(), probe.data(), x.data(), n);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  // The check itself: a gradient 0.5% too large (a wrong constant, a missed term of that size)
  // fails it. The error is then 5e-3 of the largest element, above the 3e-3 tolerance.
  for (float& g : dx) g *= 1.005f;
  EXPECT_GT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  // Spot value of the tanh approximation: gelu(1) = 0.841192.
  float one = 1.0f, y1 = 0.0f;
  cpu::gelu_forward(&y1, &one, 1);
  EXPECT_NEAR(y1, 0.841192f, 1e-5f);
}

TEST(KernelGrad, SwiGLU) {
  const int64_t rows = 3, dim = 8, ld = 2 * dim;
  auto x = random_vector(rows * ld, 14, 2.0f), probe = random_vector(rows * dim, 15);
  auto loss = [&] {
    std::vector<float> y(rows * dim);
    cpu::swiglu_forward(y.data(), x.data(), x.data() + dim, rows, dim, ld);
    return dot(y, probe);
  };
  std::vector<float> dx(rows * ld);
  cpu::swiglu_backward(dx.data(), dx.data() + dim, probe.data(), x.data(), x.data() + dim, rows, dim, ld);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
}

TEST(KernelGrad, RopeIsOrthogonalAndInvertible) {
  const int64_t batch = 2, seq = 5, heads = 3, d = 8, ld = heads * d;
  const auto table = cpu::make_rope_table(d, 16, 10000.0);
  auto x = random_vector(batch * seq * ld, 16), probe = random_vector(batch * seq * ld, 17);
  auto loss = [&] {
    auto y = x;
    cpu::rope_apply(y.data(), batch, seq, heads, ld, table, false);
    return dot(y, probe);
  };
  auto dx = probe;  // backward of a rotation is the inverse rotation of the upstream gradient
  cpu::rope_apply(dx.data(), batch, seq, heads, ld, table, true);
  EXPECT_LT(max_gradient_error(x, dx, loss), kGradCheckTolerance);
  auto y = x;
  cpu::rope_apply(y.data(), batch, seq, heads, ld, table, false);
  cpu::rope_apply(y.data(), batch, seq, heads, ld, table, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5f);
  // Position 0 is not rotated; position 1 rotates pair (0, d/2) by exactly 1 radian.
  auto z = x;
  cpu::rope_apply(z.data(), 1, seq, heads, ld, table, false);
  EXPECT_FLOAT_EQ(z[0], x[0]);
  const float a = x[ld], b = x[ld + d / 2];
  EXPECT_NEAR(z[ld], a * std::cos(1.0f) - b * std::sin(1.0f), 1e-5f);
}

// Naive attention with explicit softmax, for reference: causal, or over each row's key range
// [begin, end) when `ranges` is given.
std::vector<float> naive_attention(const std::vector<float>& qkv, const cpu::AttentionShape& s,
                                   const std::vector<int32_t>& ranges = {}) {
  std::vector<float> out(s.batch * s.seq_len * s.out_ld(), 0.0f);
  const int64_t d = s.head_dim, ld = s.qkv_ld();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / (s.heads / s.kv_heads);
      for (int64_t i = 0; i < s.seq_len; ++i) {
        const int64_t row = b * s.seq_len + i;
        const int64_t begin = ranges.empty() ? 0 : ranges[2 * row];
        const int64_t end = ranges.empty() ? i + 1 : ranges[2 * row + 1];
        std::vector<double> p(i + 1, 0.0);
        double mx = -1e30, sum = 0;
        for (int64_t j = begin; j < end; ++j) {
          double sc = 0;
          for (int64_t c = 0; c < d; ++c)
            sc += qkv[(b * s.seq_len + i) * ld + h * d + c] * qkv[(b * s.seq_len + j) * ld + (s.heads + kvh) * d + c];
          p[j] = sc / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = begin; j < end; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = begin; j < end; ++j)
          for (int64_t c = 0; c < d; ++c)
            out[(b * s.seq_len + i) * s.out_ld() + h * d + c] += static_cast<float>(
                p[j] / sum * qkv[(b * s.seq_len + j) * ld + (s.heads + s.kv_heads + kvh) * d + c]);
      }
    }
  return out;
}

class AttentionKernel : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(AttentionKernel, MatchesNaiveAndGradChecks) {
  const auto [seq, heads, kv_heads] = GetParam();
  const cpu::AttentionShape s{2, seq, heads, kv_heads, 8};
  auto qkv = random_vector(s.batch * seq * s.qkv_ld(), 18);
  std::vector<float> out(s.batch * seq * s.out_ld()), lse(s.batch * heads * seq);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), s);
  const auto expected = naive_attention(qkv, s);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-5f) << i;

  auto probe = random_vector(out.size(), 19);
  auto loss = [&] {
    std::vector<float> o(out.size()), l(lse.size());
    cpu::attention_forward(o.data(), l.data(), qkv.data(), s);
    return dot(o, probe);
  };
  std::vector<float> dqkv(qkv.size());
  cpu::attention_backward(dqkv.data(), probe.data(), qkv.data(), out.data(), lse.data(), s);
  EXPECT_LT(max_gradient_error(qkv, dqkv, loss, 300), kGradCheckTolerance);
}

// seq 70 and 150 cross the 64-row/64-key tile boundaries (150: a partly masked key tile); (4, 2) and (4, 1) are grouped-query attention.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionKernel,
                         ::testing::Values(std::make_tuple(5, 2, 2), std::make_tuple(9, 4, 2),
                                           std::make_tuple(7, 4, 1), std::make_tuple(70, 2, 1),
                                           std::make_tuple(150, 2, 2)));

// Key ranges (0, i + 1) are the causal mask: the same bits as no ranges, forward and backward.
TEST(AttentionKeyRanges, CausalRangesGiveTheCausalKernelsBits) {
  const cpu::AttentionShape s{2, 150, 4, 2, 8};
  const auto qkv = random_vector(s.batch * s.seq_len * s.qkv_ld(), 40);
  const auto d_out = random_vector(s.batch * s.seq_len * s.out_ld(), 41);
  std::vector<int32_t> causal;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int32_t i = 0; i < s.seq_len; ++i) causal.insert(causal.end(), {0, i + 1});
  std::vector<float> out(d_out.size()), lse(s.batch * s.heads * s.seq_len), dqkv(qkv.size());
  std::vector<float> out_r(out.size()), lse_r(lse.size()), dqkv_r(qkv.size());
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), s);
  cpu::attention_forward(out_r.data(), lse_r.data(), qkv.data(), s, causal.data());
  cpu::attention_backward(dqkv.data(), d_out.data(), qkv.data(), out.data(), lse.data(), s);
  cpu::attention_backward(dqkv_r.data(), d_out.data(), qkv.data(), out.data(), lse.data(), s,
                          causal.data());
  EXPECT_EQ(out, out_r);
  EXPECT_EQ(lse, lse_r);
  EXPECT_EQ(dqkv, dqkv_r);
}

// Documents packed into one sequence, each row seeing only its own document's earlier tokens:
// every document's rows equal the causal kernel run on that document alone (a sequence of its
// own length), against the naive formula too, and the gradient checks. Boundaries fall inside
// and on the 64-row tiles, and differ between the two sequences.
TEST(AttentionKeyRanges, PackedDocumentsEqualEachDocumentAloneAndGradCheck) {
  const cpu::AttentionShape s{2, 150, 4, 2, 8};
  const std::vector<std::vector<int32_t>> starts = {{0, 37, 64, 100}, {0, 1, 65, 149}};
  const auto qkv = random_vector(s.batch * s.seq_len * s.qkv_ld(), 42);
  std::vector<int32_t> ranges;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int32_t i = 0; i < s.seq_len; ++i) {
      int32_t begin = 0;
      for (int32_t start : starts[static_cast<size_t>(b)])
        if (start <= i) begin = start;
      ranges.insert(ranges.end(), {begin, i + 1});
    }
  std::vector<float> out(s.batch * s.seq_len * s.out_ld()), lse(s.batch * s.heads * s.seq_len);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), s, ranges.data());
  const auto naive = naive_attention(qkv, s, ranges);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], naive[i], 1e-5f) << i;

  for (int64_t b = 0; b < s.batch; ++b) {
    const auto& doc_starts = starts[static_cast<size_t>(b)];
    for (size_t k = 0; k < doc_starts.size(); ++k) {
      const int64_t first = doc_starts[k];
      const int64_t length = (k + 1 < doc_starts.size() ? doc_starts[k + 1] : s.seq_len) - first;
      const cpu::AttentionShape alone{1, length, s.heads, s.kv_heads, s.head_dim};
      const auto row0 = qkv.begin() + (b * s.seq_len + first) * s.qkv_ld();
      const std::vector<float> doc_qkv(row0, row0 + length * s.qkv_ld());
      std::vector<float> doc_out(length * s.out_ld()), doc_lse(s.heads * length);
      cpu::attention_forward(doc_out.data(), doc_lse.data(), doc_qkv.data(), alone);
      for (int64_t i = 0; i < length * s.out_ld(); ++i)
        ASSERT_NEAR(out[(b * s.seq_len + first) * s.out_ld() + i], doc_out[i], 1e-6f)
            << "sequence " << b << " document " << k << " element " << i;
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < length; ++i)
          ASSERT_NEAR(lse[(b * s.heads + h) * s.seq_len + first + i], doc_lse[h * length + i], 1e-5f);
    }
  }

  auto x = qkv;
  const auto probe = random_vector(out.size(), 43);
  auto loss = [&] {
    std::vector<float> o(out.size()), l(lse.size());
    cpu::attention_forward(o.data(), l.data(), x.data(), s, ranges.data());
    return dot(o, probe);
  };
  std::vector<float> dqkv(qkv.size());
  cpu::attention_backward(dqkv.data(), probe.data(), qkv.data(), out.data(), lse.data(), s,
                          ranges.data());
  EXPECT_LT(max_gradient_error(x, dqkv, loss, 300), kGradCheckTolerance);
}

// A sliding window of 20 keys (begin = i - 19) against the naive formula.
TEST(AttentionKeyRanges, SlidingWindowMatchesNaive) {
  const cpu::AttentionShape s{1, 130, 2, 1, 8};
  const auto qkv = random_vector(s.seq_len * s.qkv_ld(), 44);
  std::vector<int32_t> ranges;
  for (int32_t i = 0; i < s.seq_len; ++i) ranges.insert(ranges.end(), {std::max(0, i - 19), i + 1});
  std::vector<float> out(s.seq_len * s.out_ld()), lse(s.heads * s.seq_len);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), s, ranges.data());
  const auto naive = naive_attention(qkv, s, ranges);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], naive[i], 1e-5f) << i;
}

// Context parallelism's attention: the queries of chunks 0 and 3 of a sequence cut into 4 (what
// cp rank 0 of 2 holds) over the keys and values of the whole sequence, with causal ranges from
// the queries' global positions, equal the rows of self-attention over the whole sequence; so
// do their query gradients, and the key/value gradients equal self-attention's when only those
// rows carry an output gradient. Both buffers grad-check.
TEST(CrossAttention, LocalQueriesOverGatheredKeysEqualSelfAttentionRows) {
  const cpu::AttentionShape s{2, 144, 4, 2, 8};  // chunks of 36 rows: tiles of 64 straddle them
  const int64_t chunk = s.seq_len / 4, q_len = 2 * chunk, kv_ld = 2 * s.kv_heads * s.head_dim;
  const auto qkv = random_vector(s.batch * s.seq_len * s.qkv_ld(), 45);
  std::vector<int64_t> rows;  // positions of the local queries in their sequence
  for (int64_t t = 0; t < chunk; ++t) rows.push_back(t);
  for (int64_t t = 3 * chunk; t < 4 * chunk; ++t) rows.push_back(t);
  std::vector<float> q(s.batch * q_len * s.qkv_ld()), kv(s.batch * s.seq_len * kv_ld);
  std::vector<int32_t> ranges;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < q_len; ++i) {
      const float* src = &qkv[(b * s.seq_len + rows[i]) * s.qkv_ld()];
      std::copy(src, src + s.qkv_ld(), &q[(b * q_len + i) * s.qkv_ld()]);
      ranges.insert(ranges.end(), {0, static_cast<int32_t>(rows[i] + 1)});
    }
    for (int64_t t = 0; t < s.seq_len; ++t) {
      const float* src = &qkv[(b * s.seq_len + t) * s.qkv_ld() + s.heads * s.head_dim];
      std::copy(src, src + kv_ld, &kv[(b * s.seq_len + t) * kv_ld]);
    }
  }
  const cpu::CrossAttentionShape cs{s.batch, q_len, s.seq_len, s.heads, s.kv_heads, s.head_dim};
  std::vector<float> out(s.batch * q_len * s.out_ld()), lse(s.batch * s.heads * q_len);
  cpu::cross_attention_forward(out.data(), lse.data(), q.data(), s.qkv_ld(), kv.data(), kv_ld, cs,
                               ranges.data());
  std::vector<float> full_out(s.batch * s.seq_len * s.out_ld()), full_lse(s.batch * s.heads * s.seq_len);
  cpu::attention_forward(full_out.data(), full_lse.data(), qkv.data(), s);
  auto local = [&](int64_t b, int64_t i) { return b * q_len + i; };
  auto whole = [&](int64_t b, int64_t i) { return b * s.seq_len + rows[i]; };
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t c = 0; c < s.out_ld(); ++c)
        ASSERT_NEAR(out[local(b, i) * s.out_ld() + c], full_out[whole(b, i) * s.out_ld() + c], 1e-6f);
      for (int64_t h = 0; h < s.heads; ++h)
        ASSERT_NEAR(lse[(b * s.heads + h) * q_len + i], full_lse[(b * s.heads + h) * s.seq_len + rows[i]], 1e-5f);
    }

  // Gradients: an output gradient on the local rows only.
  const auto probe = random_vector(out.size(), 46);
  std::vector<float> full_probe(full_out.size(), 0.0f);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < q_len; ++i)
      std::copy(&probe[local(b, i) * s.out_ld()], &probe[local(b, i) * s.out_ld()] + s.out_ld(),
                &full_probe[whole(b, i) * s.out_ld()]);
  std::vector<float> d_q(q.size(), 0.0f), d_kv(kv.size()), d_full(qkv.size());
  cpu::cross_attention_backward(d_q.data(), d_kv.data(), probe.data(), q.data(), s.qkv_ld(), kv.data(),
                                kv_ld, out.data(), lse.data(), cs, ranges.data());
  cpu::attention_backward(d_full.data(), full_probe.data(), qkv.data(), full_out.data(), full_lse.data(), s);
  double scale = 0;
  for (float g : d_full) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < q_len; ++i)
      for (int64_t c = 0; c < s.heads * s.head_dim; ++c)
        ASSERT_NEAR(d_q[local(b, i) * s.qkv_ld() + c], d_full[whole(b, i) * s.qkv_ld() + c], 1e-5 * scale);
    for (int64_t t = 0; t < s.seq_len; ++t)
      for (int64_t c = 0; c < kv_ld; ++c)
        ASSERT_NEAR(d_kv[(b * s.seq_len + t) * kv_ld + c],
                    d_full[(b * s.seq_len + t) * s.qkv_ld() + s.heads * s.head_dim + c], 1e-5 * scale);
  }

  auto loss = [&] {
    std::vector<float> o(out.size()), l(lse.size());
    cpu::cross_attention_forward(o.data(), l.data(), q.data(), s.qkv_ld(), kv.data(), kv_ld, cs,
                                 ranges.data());
    return dot(o, probe);
  };
  auto q_only = d_q;  // the key/value columns of q are unused: their gradient is 0
  for (int64_t r = 0; r < s.batch * q_len; ++r)
    for (int64_t c = s.heads * s.head_dim; c < s.qkv_ld(); ++c) q_only[r * s.qkv_ld() + c] = 0.0f;
  EXPECT_LT(max_gradient_error(q, q_only, loss, 200), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(kv, d_kv, loss, 200), kGradCheckTolerance);
}

// Ring attention's arithmetic: keys split into two blocks, each attended to alone (rows that
// see none of a block get out 0 and lse -inf) and merged through the log-sum-exps, equal
// attention over all keys; the blocks' backwards with the merged out and lse add up to the
// whole backward.
TEST(CrossAttention, BlocksMergedThroughTheirLogSumExpsEqualTheWholeAndSoDoTheirGradients) {
  const int64_t batch = 2, q_len = 40, kv_len = 96, heads = 4, kv_heads = 2, d = 8, split = 60;
  const int64_t q_ld = heads * d, kv_ld = 2 * kv_heads * d;
  const auto q = random_vector(batch * q_len * q_ld, 51), kv = random_vector(batch * kv_len * kv_ld, 52);
  std::vector<int32_t> ranges, first, second;
  for (int64_t row = 0; row < batch * q_len; ++row) {
    // Rows end in either block; some start in the second (none of the first), some end in the
    // first (none of the second).
    const auto begin = static_cast<int32_t>((row * 7) % 70), end = static_cast<int32_t>(begin + 1 + (row * 13) % 26);
    ranges.insert(ranges.end(), {begin, end});
    auto clip = [](int64_t x, int64_t lo, int64_t hi) { return static_cast<int32_t>(std::clamp(x, lo, hi) - lo); };
    first.insert(first.end(), {clip(begin, 0, split), clip(end, 0, split)});
    second.insert(second.end(), {clip(begin, split, kv_len), clip(end, split, kv_len)});
  }
  std::vector<float> kv1(kv.size()), kv2(kv.size());  // the two blocks, [batch * rows, kv_ld] each
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < kv_len; ++t) {
      float* dst = t < split ? &kv1[(b * split + t) * kv_ld] : &kv2[(b * (kv_len - split) + t - split) * kv_ld];
      std::copy(&kv[(b * kv_len + t) * kv_ld], &kv[(b * kv_len + t) * kv_ld] + kv_ld, dst);
    }
  const cpu::CrossAttentionShape whole{batch, q_len, kv_len, heads, kv_heads, d};
  const cpu::CrossAttentionShape s1{batch, q_len, split, heads, kv_heads, d};
  const cpu::CrossAttentionShape s2{batch, q_len, kv_len - split, heads, kv_heads, d};
  std::vector<float> out(batch * q_len * q_ld), lse(batch * heads * q_len);
  cpu::cross_attention_forward(out.data(), lse.data(), q.data(), q_ld, kv.data(), kv_ld, whole, ranges.data());
  std::vector<float> merged(out.size()), merged_lse(lse.size()), part(out.size()), part_lse(lse.size());
  cpu::cross_attention_forward(merged.data(), merged_lse.data(), q.data(), q_ld, kv1.data(), kv_ld, s1, first.data());
  for (int64_t row = 0; row < batch * q_len; ++row)
    if (first[2 * row] == first[2 * row + 1])  // sees none of the first block
      for (int64_t h = 0; h < heads; ++h) {
        ASSERT_EQ(merged_lse[((row / q_len) * heads + h) * q_len + row % q_len], -INFINITY);
        ASSERT_EQ(merged[row * q_ld + h * d], 0.0f);
      }
  cpu::cross_attention_forward(part.data(), part_lse.data(), q.data(), q_ld, kv2.data(), kv_ld, s2, second.data());
  cpu::merge_attention_partials(merged.data(), merged_lse.data(), part.data(), part_lse.data(), batch, q_len, heads, d);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(merged[i], out[i], 1e-6f) << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(merged_lse[i], lse[i], 1e-5f) << i;

  const auto probe = random_vector(out.size(), 53);
  std::vector<float> d_q(q.size()), d_kv(kv.size());
  cpu::cross_attention_backward(d_q.data(), d_kv.data(), probe.data(), q.data(), q_ld, kv.data(), kv_ld, out.data(),
                                lse.data(), whole, ranges.data());
  std::vector<float> d_q1(q.size()), d_q2(q.size()), d_kv1(kv.size()), d_kv2(kv.size());
  cpu::cross_attention_backward(d_q1.data(), d_kv1.data(), probe.data(), q.data(), q_ld, kv1.data(), kv_ld,
                                merged.data(), merged_lse.data(), s1, first.data());
  cpu::cross_attention_backward(d_q2.data(), d_kv2.data(), probe.data(), q.data(), q_ld, kv2.data(), kv_ld,
                                merged.data(), merged_lse.data(), s2, second.data());
  double scale = 0;
  for (float g : d_kv) scale = std::max(scale, static_cast<double>(std::fabs(g)));
  for (size_t i = 0; i < d_q.size(); ++i) ASSERT_NEAR(d_q1[i] + d_q2[i], d_q[i], 1e-5 * scale) << i;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < kv_len; ++t)
      for (int64_t c = 0; c < kv_ld; ++c) {
        const float got = t < split ? d_kv1[(b * split + t) * kv_ld + c] : d_kv2[(b * (kv_len - split) + t - split) * kv_ld + c];
        ASSERT_NEAR(got, d_kv[(b * kv_len + t) * kv_ld + c], 1e-5 * scale) << b << " " << t << " " << c;
      }
}

TEST(KernelGrad, CrossEntropyChunkedMatchesNaiveAndGradChecks) {
  const int64_t rows = 6, dim = 8, vocab = 37;
  auto h = random_vector(rows * dim, 20), w = random_vector(vocab * dim, 21);
  std::vector<int32_t> targets = {0, 36, 5, -1, 17, 17};  // -1 is ignored
  double naive = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    std::vector<double> z(vocab);
    double mx = -1e30, sum = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t c = 0; c < dim; ++c) z[v] += h[r * dim + c] * w[v * dim + c];
      mx = std::max(mx, z[v]);
    }
    for (double zv : z) sum += std::exp(zv - mx);
    naive += mx + std::log(sum) - z[targets[r]];
  }
  for (int64_t chunk : {5, 16, 37, 1000}) {
    auto run = [&](float* dh, float* dw) {
      cpu::CrossEntropyArgs a{h.data(), w.data(), targets.data(), rows, dim, vocab, chunk, 0.5f, dh, dw, nullptr, nullptr};
      return cpu::lm_head_cross_entropy(a);
    };
    EXPECT_NEAR(run(nullptr, nullptr), naive, 1e-4) << "chunk " << chunk;
    std::vector<float> dh(rows * dim), dw(vocab * dim, 0.0f);
    run(dh.data(), dw.data());
    auto loss = [&] { return 0.5 * run(nullptr, nullptr); };
    EXPECT_LT(max_gradient_error(h, dh, loss), kGradCheckTolerance) << "chunk " << chunk;
    EXPECT_LT(max_gradient_error(w, dw, loss), kGradCheckTolerance) << "chunk " << chunk;
    for (int64_t c = 0; c < dim; ++c) EXPECT_EQ(dh[3 * dim + c], 0.0f);  // ignored row
  }
}

TEST(KernelGrad, Embedding) {
  const int64_t batch = 2, seq = 3, dim = 4, vocab = 5;
  auto wte = random_vector(vocab * dim, 22), wpe = random_vector(seq * dim, 23);
  std::vector<int32_t> tokens = {1, 4, 1, 0, 1, 3};  // repeated ids accumulate
  auto probe = random_vector(batch * seq * dim, 24);
  auto loss = [&] {
    std::vector<float> y(batch * seq * dim);
    cpu::embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), batch, seq, dim);
    return dot(y, probe);
  };
  std::vector<float> dwte(vocab * dim, 0.0f), dwpe(seq * dim, 0.0f);
  cpu::embedding_backward(dwte.data(), dwpe.data(), probe.data(), tokens.data(), batch, seq, dim);
  EXPECT_LT(max_gradient_error(wte, dwte, loss), kGradCheckTolerance);
  EXPECT_LT(max_gradient_error(wpe, dwpe, loss), kGradCheckTolerance);
}

TEST(Kernel, AdamWMatchesScalarFormula) {
  const int64_t n = 10;
  auto p = random_vector(n, 25), g = random_vector(n, 26);
  std::vector<float> m(n, 0.1f), v(n, 0.2f);
  auto p0 = p;
  const cpu::AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
  for (int64_t i = 0; i < n; ++i) {
    const double mi = 0.9 * 0.1 + 0.1 * g[i], vi = 0.95 * 0.2 + 0.05 * g[i] * g[i];
    const double mhat = mi / (1 - std::pow(0.9, 3)), vhat = vi / (1 - std::pow(0.95, 3));
    const double expected = p0[i] * (1 - 1e-2 * 0.1) - 1e-2 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(p[i], expected, 1e-6);
  }
}

}  // namespace
}  // namespace loom::test
