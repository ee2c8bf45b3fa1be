// Transformer::enable_fp8: the blocks' projections switched to FP8 GEMMs (model/fp8_linear.hpp).
#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/transformer.hpp"

namespace loom {

Fp8Training& Transformer::enable_fp8(const Fp8Config& config) {
  LOOM_CHECK(!fp8_, "FP8 training is already on for this model");
  auto context = std::make_shared<Fp8Context>();
  context->config = config;
  // Every block has the same projections, so a layer's place in the whole model (its slot in
  // the amax histories checkpoints carry, whichever pipeline stage holds it) is its block's
  // layer times their count plus its place in the block.
  std::vector<Fp8Linear*> layers;
  std::vector<int64_t> slots;
  int64_t per_block = -1;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int64_t i = 0; i < chunks_[c].layers(); ++i) {
      TransformerBlock& block = *blocks[static_cast<size_t>(chunk_first_block_[c] + i)];
      if (block.moe)
        throw_error("train.precision = \"fp8\" with model.n_experts = ", config_.n_experts,
                    ": the experts' grouped GEMMs have no FP8 path; use a dense model or "
                    "train.precision = \"bf16\"");
      std::vector<Linear*> linears;
      for (std::vector<Linear*> group :
           {block.attention.input_projection->linears(),
            block.attention.output_projection->linears(), block.mlp->input_projection->linears(),
            block.mlp->output_projection->linears()}) {
        LOOM_CHECK(!group.empty(), "enable_fp8: a projection without Linear layers");
        linears.insert(linears.end(), group.begin(), group.end());
      }
      if (per_block < 0) per_block = static_cast<int64_t>(linears.size());
      LOOM_CHECK(per_block == static_cast<int64_t>(linears.size()),
                 "enable_fp8: blocks with different projections");
      const int64_t layer = chunks_[c].first_layer + i;
      for (size_t j = 0; j < linears.size(); ++j) {
        layers.push_back(linears[j]->enable_fp8(context));
        slots.push_back(layer * per_block + static_cast<int64_t>(j));
      }
    }
  fp8_ = std::make_unique<Fp8Training>(std::move(context), std::move(layers), std::move(slots),
                                       config_.n_layer * std::max<int64_t>(per_block, 0));
  return *fp8_;
}

}  // namespace loom
