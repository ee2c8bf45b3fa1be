// Output projection + softmax + cross-entropy against loom::cpu::lm_head_cross_entropy, with
// several vocabulary chunks (the last one partial) and with one chunk covering the vocabulary,
// ignored (negative) targets, per-row losses, accumulation into d_weight and overwriting of
// d_hidden. f32: loss rtol 1e-5, gradients rtol 1e-4 with a floor of 1e-4 x max|want| (f32
// cuBLASLt products). bf16: logits and statistics are f32 from the same bf16 values, so the
// loss keeps 1e-5; gradients go through a bf16-rounded logit gradient: rtol 2e-2, atol
// 1e-2 x max|want|.
#include <gtest/gtest.h>

#include "gpu_test_support.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cuda/cross_entropy.hpp"

namespace loom::cuda::test {
namespace {

class CudaCrossEntropyTest : public CudaTest {};

constexpr int64_t kRows = 24, kDim = 32, kVocab = 1000;

std::vector<int32_t> targets_with_ignored() {
  std::vector<int32_t> t(kRows);
  for (int64_t r = 0; r < kRows; ++r)
    t[r] = r % 7 == 3 ? -1 : static_cast<int32_t>((r * 389) % kVocab);
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
  for (const int64_t chunk : {int64_t{128}, int64_t{4096}}) {
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

TEST_F(CudaCrossEntropyTest, Bf16MatchesCpuOnTheSameValues) {
  const auto hidden = rounded_to_bf16(random_vector(static_cast<size_t>(kRows * kDim), 7));
  const auto weight = rounded_to_bf16(random_vector(static_cast<size_t>(kVocab * kDim), 8));
  const auto targets = targets_with_ignored();
  const auto d_weight0 = random_vector(weight.size(), 9);
  const Reference ref = cpu_reference(hidden, weight, targets, d_weight0);
  for (const int64_t chunk : {int64_t{128}, int64_t{4096}}) {
    SCOPED_TRACE(testing::Message() << "vocab_chunk " << chunk);
    DeviceBuffer<bf16> g_hidden(to_bf16(hidden)), g_weight(to_bf16(weight)),
        g_dhidden(hidden.size());
    DeviceBuffer<float> g_dweight(d_weight0), g_losses(kRows);
    DeviceBuffer<int32_t> g_targets(targets);
    CrossEntropyArgsBf16 a;
    a.hidden = g_hidden.get(), a.weight = g_weight.get(), a.targets = g_targets.get();
    a.rows = kRows, a.dim = kDim, a.vocab = kVocab, a.vocab_chunk = chunk;
    a.grad_scale = 1.0f / kRows;
    a.d_hidden = g_dhidden.get(), a.d_weight = g_dweight.get(), a.row_losses = g_losses.get();
    const double loss = lm_head_cross_entropy(a);
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
    expect_close(g_losses.download(), ref.row_losses, 1e-5, 1e-6, "row_losses");
    expect_close(from_bf16(g_dhidden.download()), ref.d_hidden, 2e-2, 1e-2 * max_abs(ref.d_hidden),
                 "d_hidden");
    // d_weight0 dominates d_weight's magnitude; compare the accumulated change instead.
    auto got_change = g_dweight.download(), want_change = ref.d_weight;
    for (size_t i = 0; i < got_change.size(); ++i)
      got_change[i] -= d_weight0[i], want_change[i] -= d_weight0[i];
    expect_close(got_change, want_change, 2e-2, 1e-2 * max_abs(want_change), "d_weight change");
  }
}

}  // namespace
}  // namespace loom::cuda::test
