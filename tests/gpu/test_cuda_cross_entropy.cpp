// Output projection + softmax + cross-entropy against loom::cpu::lm_head_cross_entropy, with
// several vocabulary chunks (the last one partial) and with one chunk covering the vocabulary,
// ignored (negative) targets, per-row losses, accumulation into d_weight and overwriting of
// d_hidden. The chunk widths put the device kernels' 16-byte loads and stores through their
// edges: 128 (the last chunk 104 wide, padded to 112), 333 (not a multiple of 4; the last chunk
// 1 wide, padded to 16, with a target in it) and 4096 (one chunk of 1000, padded to 1008).
// f32: loss rtol 1e-5, gradients rtol 1e-4 with a floor of 1e-4 x max|want| (f32 cuBLASLt
// products). bf16: with f32 logits and with bf16 ones (the default), bounds derived at the test.
// The vocabulary-parallel passes are checked on their own too (ShardPasses*, tolerances there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/vocab_shard.hpp"
#include "loom/kernels/cuda/cross_entropy.hpp"

namespace loom::cuda::test {
namespace {

class CudaCrossEntropyTest : public CudaTest {};

constexpr int64_t kRows = 24, kDim = 32, kVocab = 1000;

std::vector<int32_t> targets_with_ignored() {
  std::vector<int32_t> t(kRows);
  for (int64_t r = 0; r < kRows; ++r)
    t[r] = r % 7 == 3 ? -1 : static_cast<int32_t>((r * 389) % kVocab);
  t[kRows - 1] = kVocab - 1;  // the last id: alone in the last chunk when chunks are 333 wide
  return t;
}

struct Reference {
  double loss = 0.0;
  std::vector<float> row_losses, d_hidden, d_weight;
};

Reference cpu_reference(const std::vector<float>& hidden, const std::vector<float>& weight,
                        const std::vector<int32_t>& targets, const std::vector<float>& d_weight0) {
  Reference ref;
  ref.row_losses.resize(kRows);
  ref.d_hidden.resize(static_cast<size_t>(kRows * kDim));
  ref.d_weight = d_weight0;
  cpu::CrossEntropyArgs a{};
  a.hidden = hidden.data();
  a.weight = weight.data();
  a.targets = targets.data();
  a.rows = kRows, a.dim = kDim, a.vocab = kVocab, a.vocab_chunk = 128;
  a.grad_scale = 1.0f / kRows;
  a.d_hidden = ref.d_hidden.data();
  a.d_weight = ref.d_weight.data();
  a.row_losses = ref.row_losses.data();
  ref.loss = cpu::lm_head_cross_entropy(a);
  return ref;
}

TEST_F(CudaCrossEntropyTest, F32MatchesCpuForChunkedAndSingleChunkVocabularies) {
  const auto hidden = random_vector(static_cast<size_t>(kRows * kDim), 1);
  const auto weight = random_vector(static_cast<size_t>(kVocab * kDim), 2);
  const auto targets = targets_with_ignored();
  const auto d_weight0 = random_vector(weight.size(), 3);
  const Reference ref = cpu_reference(hidden, weight, targets, d_weight0);
  for (const int64_t chunk : {int64_t{128}, int64_t{333}, int64_t{4096}}) {
    for (const bool own_workspace : {false, true}) {
      SCOPED_TRACE(testing::Message() << "vocab_chunk " << chunk << " workspace " << own_workspace);
      DeviceBuffer<float> g_hidden(hidden), g_weight(weight), g_dweight(d_weight0);
      DeviceBuffer<float> g_dhidden(random_vector(hidden.size(), 4, 1e3f, 2e3f)), g_losses(kRows);
      DeviceBuffer<int32_t> g_targets(targets);
      const size_t ws_bytes = cross_entropy_workspace_bytes(kRows, kDim, kVocab, chunk, false);
      DeviceBuffer<char> workspace(ws_bytes);
      CrossEntropyArgs a;
      a.hidden = g_hidden.get(), a.weight = g_weight.get(), a.targets = g_targets.get();
      a.rows = kRows, a.dim = kDim, a.vocab = kVocab, a.vocab_chunk = chunk;
      a.grad_scale = 1.0f / kRows;
      a.d_hidden = g_dhidden.get(), a.d_weight = g_dweight.get(), a.row_losses = g_losses.get();
      if (own_workspace) a.workspace = workspace.get(), a.workspace_bytes = ws_bytes;
      const double loss = lm_head_cross_entropy(a);
      EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
      expect_close(g_losses.download(), ref.row_losses, 1e-5, 1e-6, "row_losses");
      expect_close(g_dhidden.download(), ref.d_hidden, 1e-4, 1e-4 * max_abs(ref.d_hidden),
                   "d_hidden");
      expect_close(g_dweight.download(), ref.d_weight, 1e-4, 1e-4 * max_abs(ref.d_weight),
                   "d_weight");
    }
  }
}

TEST_F(CudaCrossEntropyTest, LossOnlyLeavesGradientsAlone) {
  const auto hidden = random_vector(static_cast<size_t>(kRows * kDim), 5);
  const auto weight = random_vector(static_cast<size_t>(kVocab * kDim), 6);
  const auto targets = targets_with_ignored();
  const Reference ref =
      cpu_reference(hidden, weight, targets, std::vector<float>(weight.size(), 0.0f));
  DeviceBuffer<float> g_hidden(hidden), g_weight(weight);
  DeviceBuffer<int32_t> g_targets(targets);
  CrossEntropyArgs a;
  a.hidden = g_hidden.get(), a.weight = g_weight.get(), a.targets = g_targets.get();
  a.rows = kRows, a.dim = kDim, a.vocab = kVocab, a.vocab_chunk = 300;
  EXPECT_NEAR(lm_head_cross_entropy(a), ref.loss, 1e-5 * ref.loss);
}

// bf16, both logit precisions, against the CPU's f32 head on the same (bf16-valued) inputs, with
// bounds derived per element (bf16 keeps 8 significant bits: one round-to-nearest moves a value
// by at most 2^-8 of it). Row r's logits z (in double here), M_r = max_j |z_rj|, p = softmax(z).
// bf16 logits (the default) are rounded once: the row's lse moves by at most 2^-8 M_r and its
// target logit by as much, so its loss by 2^-7 M_r, and each p_j by at most p_j a_r, a_r =
// exp(2^-7 M_r) - 1. Both sides sum 32 f32 products in their own order, each within 32 x 2^-24
// S_r of the exact logit (S_r = max_j sum_k |h_rk w_jk|): the lse and the target logit move by
// twice that each, 2^-16 S_r covers both, added to the shift in either mode (f32 logits,
// LOOM_CUDA_LOGITS=f32, have only it): a_r = exp(shift_r) - 1. The logit gradient g = scale (p -
// onehot) is then rounded to bf16: |g' - g| <= scale (p_j a_r (1 + 2^-8) + 2^-8 |p_j - [j = t]|)
// = G_rj. d_hidden[r, k] moves by sum_j G_rj |w_jk| and is rounded to bf16 once (2^-8 of it);
// d_weight[j, k] by sum_r G_rj |h_rk|. Each bound adds f32's floor (1e-5 relative, 1e-4 x
// max|want|: cuBLASLt's and the CPU's summation orders).
class LogitsModeGuard {
 public:
  explicit LogitsModeGuard(bool on) : previous_(bf16_logits()) { set_bf16_logits(on); }
  ~LogitsModeGuard() { set_bf16_logits(previous_); }

 private:
  bool previous_;
};

TEST_F(CudaCrossEntropyTest, Bf16MatchesCpuOnTheSameValues) {
  const auto hidden = rounded_to_bf16(random_vector(static_cast<size_t>(kRows * kDim), 7));
  const auto weight = rounded_to_bf16(random_vector(static_cast<size_t>(kVocab * kDim), 8));
  const auto targets = targets_with_ignored();
  const auto d_weight0 = random_vector(weight.size(), 9);
  const Reference ref = cpu_reference(hidden, weight, targets, d_weight0);
  const double scale = 1.0 / kRows;
  // The reference softmax and M_r in double.
  std::vector<double> p(static_cast<size_t>(kRows * kVocab)), big_m(kRows, 0.0), big_s(kRows, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    double row_max = -1e300;
    for (int64_t j = 0; j < kVocab; ++j) {
      double z = 0, abs_sum = 0;
      for (int64_t k = 0; k < kDim; ++k) {
        const double term = static_cast<double>(hidden[r * kDim + k]) * weight[j * kDim + k];
        z += term;
        abs_sum += std::fabs(term);
      }
      p[r * kVocab + j] = z;
      big_s[r] = std::max(big_s[r], abs_sum);
      row_max = std::max(row_max, z);
      big_m[r] = std::max(big_m[r], std::fabs(z));
    }
    double sum = 0;
    for (int64_t j = 0; j < kVocab; ++j) sum += std::exp(p[r * kVocab + j] - row_max);
    for (int64_t j = 0; j < kVocab; ++j)
      p[r * kVocab + j] = std::exp(p[r * kVocab + j] - row_max) / sum;
  }
  for (const bool half : {false, true}) {
    const LogitsModeGuard mode(half);
    // G_rj, then the bounds on the loss, d_hidden and d_weight.
    std::vector<double> g_bound(p.size(), 0.0), dh_bound(hidden.size(), 0.0),
        dw_bound(weight.size(), 0.0), row_loss_bound(kRows, 0.0);
    double loss_bound = 1e-5 * ref.loss;
    for (int64_t r = 0; r < kRows; ++r) {
      const int32_t t = targets[static_cast<size_t>(r)];
      if (t < 0) continue;  // no loss, no gradient
      const double shift = (half ? std::ldexp(big_m[r], -7) : 0.0) + std::ldexp(big_s[r], -16);
      const double a = std::expm1(shift);
      row_loss_bound[r] = shift;
      loss_bound += shift;
      for (int64_t j = 0; j < kVocab; ++j) {
        const double pj = p[r * kVocab + j];
        g_bound[r * kVocab + j] =
            scale * (pj * a * (1 + 1.0 / 256) + std::fabs(pj - (j == t ? 1.0 : 0.0)) / 256);
      }
    }
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < kVocab; ++j) {
        const double g = g_bound[r * kVocab + j];
        if (g == 0) continue;
        for (int64_t k = 0; k < kDim; ++k) {
          dh_bound[r * kDim + k] += g * std::fabs(weight[j * kDim + k]);
          dw_bound[j * kDim + k] += g * std::fabs(hidden[r * kDim + k]);
        }
      }
    auto want_change = ref.d_weight;
    for (size_t i = 0; i < want_change.size(); ++i) want_change[i] -= d_weight0[i];
    const double dh_floor = 1e-4 * max_abs(ref.d_hidden), dw_floor = 1e-4 * max_abs(want_change);
    for (const int64_t chunk : {int64_t{128}, int64_t{333}, int64_t{4096}}) {
      SCOPED_TRACE(testing::Message()
                   << (half ? "bf16" : "f32") << " logits, vocab_chunk " << chunk);
      DeviceBuffer<bf16> g_hidden(to_bf16(hidden)), g_weight(to_bf16(weight)),
          g_dhidden(hidden.size());
      DeviceBuffer<float> g_dweight(d_weight0), g_losses(kRows);
      DeviceBuffer<int32_t> g_targets(targets);
      CrossEntropyArgsBf16 a;
      a.hidden = g_hidden.get(), a.weight = g_weight.get(), a.targets = g_targets.get();
      a.rows = kRows, a.dim = kDim, a.vocab = kVocab, a.vocab_chunk = chunk;
      a.grad_scale = static_cast<float>(scale);
      a.d_hidden = g_dhidden.get(), a.d_weight = g_dweight.get(), a.row_losses = g_losses.get();
      const double loss = lm_head_cross_entropy(a);
      EXPECT_NEAR(loss, ref.loss, loss_bound);
      const auto losses = g_losses.download();
      const auto d_hidden = from_bf16(g_dhidden.download());
      auto got_change = g_dweight.download();
      for (size_t i = 0; i < got_change.size(); ++i) got_change[i] -= d_weight0[i];
      size_t failures = 0;
      for (int64_t r = 0; r < kRows; ++r)
        if (std::fabs(losses[r] - ref.row_losses[r]) >
            row_loss_bound[r] + 1e-5 * std::fabs(ref.row_losses[r]) + 1e-6)
          ++failures;
      EXPECT_EQ(failures, 0u) << "row losses";
      failures = 0;
      for (size_t i = 0; i < d_hidden.size(); ++i) {
        const double want = ref.d_hidden[i];
        if (std::fabs(d_hidden[i] - want) > dh_bound[i] * (1 + 1.0 / 256) + std::fabs(want) / 256 +
                                                1e-5 * std::fabs(want) + dh_floor)
          ++failures;
      }
      EXPECT_EQ(failures, 0u) << "d_hidden";
      failures = 0;
      for (size_t i = 0; i < got_change.size(); ++i)
        if (std::fabs(got_change[i] - want_change[i]) >
            dw_bound[i] + 1e-5 * std::fabs(want_change[i]) + dw_floor)
          ++failures;
      EXPECT_EQ(failures, 0u) << "d_weight change";
    }
  }
}

// A vocabulary shard of ids [kShardBegin, kShardBegin + kShard) of a larger vocabulary.
constexpr int64_t kShard = 1001, kShardBegin = 2000;

// Targets inside the shard (its first and last ids among them), in other ranks' shards below
// and above it, and ignored.
std::vector<int32_t> shard_targets() {
  std::vector<int32_t> t(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    if (r % 7 == 3)
      t[r] = -1;
    else if (r % 5 == 1)
      t[r] = static_cast<int32_t>(r % 2 ? kShardBegin + kShard + r : r);
    else
      t[r] = static_cast<int32_t>(kShardBegin + (r * 389) % kShard);
  }
  t[0] = kShardBegin;
  t[kRows - 1] = kShardBegin + kShard - 1;
  return t;
}

// shard_logit_stats and shard_logit_grad against cpu::shard_logit_stats / shard_logit_grad, in
// chunks of 611 (an odd row stride: rows start at every 16-byte alignment, and both chunks,
// 611 and 390 wide, end off a multiple of 4) and in one chunk of the whole odd-width shard
// (pass 1's logits kept for pass 2), with the logits scratch on a 16-byte boundary and one
// float past it (the logit gradient then takes its single-column path).
// Tolerances. Logits are f32 dot products of 32 terms of |.| <= 1 summed in another order: the
// max and the target's logit 1e-5 (relative, and absolute for values near 0); the sum of
// exponentials 1e-5 relative (each term carries its logit's error as a relative one). The f32
// logit gradient left in place is grad_scale * exp(logit - lse) (minus grad_scale at the
// target): 1e-5 relative, as its exponent's error. d_hidden / d_weight are f32 cuBLASLt
// products: rtol 1e-4 with a floor of 1e-4 x max|want|, as above. bf16 adds to that: each logit
// gradient g is rounded to bf16 (8 significant bits: at most 2^-8 relative) before the
// products, so with |hidden|, |weight| <= 1 an output moves by at most 2^-8 x the sum of the |g|
// it adds up: a d_hidden element's sum |g| <= 2 x grad_scale over the shard (softmax mass <= 1,
// and the target's grad_scale), a d_weight element's |g| <= grad_scale over the rows; d_hidden
// is then rounded to bf16 once more (2^-8 relative).
template <typename T>
void check_shard_passes(uint32_t seed) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  auto hidden = random_vector(static_cast<size_t>(kRows * kDim), seed);
  auto weight = random_vector(static_cast<size_t>(kShard * kDim), seed + 1);
  if constexpr (kBf16) hidden = rounded_to_bf16(hidden), weight = rounded_to_bf16(weight);
  auto on_device = [](const std::vector<float>& v) {
    if constexpr (kBf16)
      return to_bf16(v);
    else
      return v;
  };
  const auto targets = shard_targets();
  const auto d_weight0 = random_vector(weight.size(), seed + 2);
  const float grad_scale = 1.0f / kRows;
  const double bf16_rounding = 1.0 / 256;
  for (const int64_t chunk : {int64_t{611}, kShard}) {
    for (const int64_t offset : {int64_t{0}, int64_t{1}}) {
      SCOPED_TRACE(testing::Message() << "chunk " << chunk << " logits offset " << offset);
      std::vector<float> logits(static_cast<size_t>(kRows * chunk)), row_max(kRows), row_sum(kRows),
          target_logit(kRows, 0.0f), lse(kRows);
      const cpu::ShardLogits c{hidden.data(), weight.data(), targets.data(), kRows,        kDim,
                               kShard,        kShardBegin,   chunk,          logits.data()};
      cpu::shard_logit_stats(c, row_max.data(), row_sum.data(), target_logit.data());
      for (int64_t r = 0; r < kRows; ++r) lse[r] = row_max[r] + std::log(row_sum[r]);
      std::vector<float> d_hidden(hidden.size()), d_weight = d_weight0;
      cpu::shard_logit_grad(c, lse.data(), grad_scale, d_hidden.data(), d_weight.data(), true);

      DeviceBuffer<T> g_hidden(on_device(hidden)), g_weight(on_device(weight)),
          g_dhidden(hidden.size());
      DeviceBuffer<int32_t> g_targets(targets);
      DeviceBuffer<float> g_logits(static_cast<size_t>(kRows * chunk + offset)), g_stats(3 * kRows),
          g_lse(lse), g_dweight(d_weight0);
      ShardLogitsT<T> a;
      a.hidden = g_hidden.get(), a.weight = g_weight.get(), a.targets = g_targets.get();
      a.rows = kRows, a.dim = kDim, a.shard = kShard, a.vocab_begin = kShardBegin, a.chunk = chunk;
      a.logits = g_logits.get() + offset;
      shard_logit_stats(a, g_stats.get(), g_stats.get() + kRows, g_stats.get() + 2 * kRows);
      const auto stats = g_stats.download();
      const auto stat = [&](int64_t i) {
        return std::vector<float>(stats.begin() + i * kRows, stats.begin() + (i + 1) * kRows);
      };
      expect_close(stat(0), row_max, 1e-5, 1e-5, "row_max");
      expect_close(stat(1), row_sum, 1e-5, 0.0, "row_sum");
      expect_close(stat(2), target_logit, 1e-5, 1e-5, "target_logit");

      shard_logit_grad(a, g_lse.get(), grad_scale, g_dhidden.get(), g_dweight.get());
      auto d_weight_change = g_dweight.download(), want_change = d_weight;
      for (size_t i = 0; i < want_change.size(); ++i)
        d_weight_change[i] -= d_weight0[i], want_change[i] -= d_weight0[i];
      if constexpr (kBf16) {
        expect_close(from_bf16(g_dhidden.download()), d_hidden, bf16_rounding + 1e-4,
                     2 * grad_scale * bf16_rounding + 1e-4 * max_abs(d_hidden), "d_hidden");
        expect_close(d_weight_change, want_change, 1e-4,
                     kRows * grad_scale * bf16_rounding + 1e-4 * max_abs(want_change),
                     "d_weight change");
      } else {
        expect_close(g_dhidden.download(), d_hidden, 1e-4, 1e-4 * max_abs(d_hidden), "d_hidden");
        expect_close(d_weight_change, want_change, 1e-4, 1e-4 * max_abs(want_change),
                     "d_weight change");
        // In place: both scratches now hold the last chunk's logit gradient, zeros in the
        // ignored rows.
        const int64_t last_width = kShard - (kShard - 1) / chunk * chunk;
        const auto got = g_logits.download();
        std::vector<float> got_grad, want_grad;
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t j = 0; j < last_width; ++j) {
            got_grad.push_back(got[offset + r * chunk + j]);
            want_grad.push_back(logits[r * chunk + j]);
          }
        expect_close(got_grad, want_grad, 1e-5, 0.0, "last chunk's logit gradient");
      }
    }
  }
}

TEST_F(CudaCrossEntropyTest, ShardPassesMatchCpuF32) { check_shard_passes<float>(11); }
TEST_F(CudaCrossEntropyTest, ShardPassesMatchCpuBf16) { check_shard_passes<bf16>(14); }

}  // namespace
}  // namespace loom::cuda::test
