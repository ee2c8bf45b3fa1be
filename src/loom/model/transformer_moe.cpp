// The Transformer's mixture-of-experts bookkeeping: what its MoE blocks saw over a step, the
// sigmoid router's selection-bias updates, and the biases as checkpoint state.
#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/model/transformer.hpp"

namespace loom {

std::vector<int64_t> Transformer::MoeTotals::expert_counts() const {
  std::vector<int64_t> out;
  for (const std::vector<int64_t>& counts : block_counts) {
    if (out.size() < counts.size()) out.resize(counts.size(), 0);
    for (size_t e = 0; e < counts.size(); ++e) out[e] += counts[e];
  }
  return out;
}

void Transformer::add_moe_totals(int64_t block, const MoeStash& s) {
  moe_totals_.aux += s.losses.aux;
  moe_totals_.z += s.losses.z;
  moe_totals_.dropped += s.dropped;
  moe_totals_.routed += s.rows * config_.experts_per_token;
  moe_totals_.loss += config_.moe_aux_loss_coef * s.losses.aux + config_.moe_z_loss_coef * s.losses.z;
  ++moe_totals_.layer_calls;
  if (moe_totals_.block_counts.size() != blocks.size()) moe_totals_.block_counts.assign(blocks.size(), {});
  std::vector<int64_t>& mine = moe_totals_.block_counts[static_cast<size_t>(block)];
  if (mine.size() != s.counts.size()) mine.assign(s.counts.size(), 0);
  for (size_t e = 0; e < s.counts.size(); ++e) mine[e] += s.counts[e];
}

void Transformer::update_moe_bias(const std::vector<std::vector<int64_t>>& block_counts) {
  if (config_.moe_bias_rate <= 0 || block_counts.size() != blocks.size()) return;
  for (size_t b = 0; b < blocks.size(); ++b)
    if (blocks[b]->moe && !block_counts[b].empty())
      blocks[b]->moe->update_bias(block_counts[b], static_cast<float>(config_.moe_bias_rate));
}

std::vector<float> Transformer::moe_biases() const {
  const auto experts = static_cast<size_t>(config_.n_experts);
  std::vector<float> out(static_cast<size_t>(config_.n_layer) * experts, 0.0f);
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int64_t i = 0; i < chunks_[c].layers(); ++i) {
      const auto& block = blocks[static_cast<size_t>(chunk_first_block_[c] + i)];
      if (!block->moe) continue;
      const std::vector<float>& bias = block->moe->bias();
      std::copy(bias.begin(), bias.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(chunks_[c].first_layer + i) * experts));
    }
  return out;
}

void Transformer::set_moe_biases(const std::vector<float>& biases) {
  const auto experts = static_cast<size_t>(config_.n_experts);
  if (biases.size() != static_cast<size_t>(config_.n_layer) * experts)
    throw_error("MoE selection biases: ", biases.size(), " values for ", config_.n_layer, " layers x ", experts,
                " experts");
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int64_t i = 0; i < chunks_[c].layers(); ++i) {
      const auto& block = blocks[static_cast<size_t>(chunk_first_block_[c] + i)];
      if (!block->moe) continue;
      const auto first = biases.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(chunks_[c].first_layer + i) * experts);
      block->moe->set_bias(std::vector<float>(first, first + static_cast<std::ptrdiff_t>(experts)));
    }
}

}  // namespace loom
