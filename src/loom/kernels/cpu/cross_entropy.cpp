#include "loom/kernels/cpu/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/vocab_shard.hpp"

namespace loom::cpu {

// The whole vocabulary is one shard starting at id 0: vocab_shard's two passes, with the
// log-sum-exp formed between them.
double lm_head_cross_entropy(const CrossEntropyArgs& a) {
  const int64_t chunk = std::min(std::max<int64_t>(a.vocab_chunk, 1), a.vocab);
  Tensor owned;
  if (!a.workspace) owned = Tensor::empty({a.rows, chunk}, DType::F32, MemCategory::Workspace);
  const ShardLogits shard{a.hidden, a.weight, a.targets, a.rows, a.dim, a.vocab, 0, chunk,
                          a.workspace ? a.workspace : owned.f32()};
  const auto rows = static_cast<size_t>(a.rows);
  std::vector<float> row_max(rows), row_sum(rows), target_logit(rows, 0.0f), lse(rows);
  shard_logit_stats(shard, row_max.data(), row_sum.data(), target_logit.data());
  double total = 0.0;
  for (int64_t r = 0; r < a.rows; ++r) {
    lse[r] = row_max[r] + std::log(row_sum[r]);
    const float loss = a.targets[r] >= 0 ? lse[r] - target_logit[r] : 0.0f;
    if (a.row_losses) a.row_losses[r] = loss;
    total += loss;
  }
  if (a.d_hidden || a.d_weight)
    shard_logit_grad(shard, lse.data(), a.grad_scale, a.d_hidden, a.d_weight, true);
  return total;
}

}  // namespace loom::cpu
