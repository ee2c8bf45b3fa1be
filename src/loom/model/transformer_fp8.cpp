// Transformer::enable_fp8: the blocks' projections switched to FP8 GEMMs (model/fp8_linear.hpp).
#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/moe.hpp"
#include "loom/model/transformer.hpp"

namespace loom {

namespace {

// FP8 layers of layer `layer` outside its experts, as the blocks build them: attention's q, k,
// v (GPT-2: one fused c_attn) and output; the MLP's gate, up (GPT-2: c_fc) and down, or a MoE
// layer's shared experts' gate, up and down.
int64_t dense_fp8_layers(const ModelConfig& m, int64_t layer) {
  const bool gpt2 = m.arch == Architecture::GPT2;
  const int64_t attention = gpt2 ? 2 : 4;
  if (!m.is_moe_layer(layer)) return attention + (gpt2 ? 2 : 3);
  return attention + (m.n_shared_experts > 0 ? 3 : 0);
}

}  // namespace

Fp8Training& Transformer::enable_fp8(const Fp8Config& config) {
  LOOM_CHECK(!fp8_, "FP8 training is already on for this model");
  // Slots in the whole model (the amax histories checkpoints carry, whichever pipeline stage
  // and ep rank holds a layer): every layer's dense projections in layer order, then every MoE
  // layer's experts in expert order, three projections each (gate, up, down).
  std::vector<int64_t> first_dense(static_cast<size_t>(config_.n_layer) + 1, 0),
      moe_ordinal(static_cast<size_t>(config_.n_layer), -1);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    first_dense[static_cast<size_t>(l) + 1] =
        first_dense[static_cast<size_t>(l)] + dense_fp8_layers(config_, l);
    if (config_.is_moe_layer(l)) moe_ordinal[static_cast<size_t>(l)] = moe_layers++;
  }
  const int64_t first_expert_slot = first_dense.back();
  const int64_t model_layers = first_expert_slot + moe_layers * config_.n_experts * 3;

  Fp8LayerGroup dense{std::make_shared<Fp8Context>(), {}, {}};
  dense.context->config = config;
  // The experts' rows come from many sequences (and ranks): their weight gradients' 128-row
  // tiles run down the expert's rows as they arrive, with no sequence to stop at.
  Fp8LayerGroup experts{std::make_shared<Fp8Context>(), {}, {}};
  experts.context->config = config;
  experts.context->config.sequence_rows = 0;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int64_t i = 0; i < chunks_[c].layers(); ++i) {
      TransformerBlock& block = *blocks[static_cast<size_t>(chunk_first_block_[c] + i)];
      const int64_t layer = chunks_[c].first_layer + i;
      std::vector<Linear*> linears;
      for (Linear* l : block.attention.input_projection->linears()) linears.push_back(l);
      for (Linear* l : block.attention.output_projection->linears()) linears.push_back(l);
      if (block.mlp) {
        for (Linear* l : block.mlp->input_projection->linears()) linears.push_back(l);
        for (Linear* l : block.mlp->output_projection->linears()) linears.push_back(l);
      }
      int64_t slot = first_dense[static_cast<size_t>(layer)];
      for (Linear* linear : linears) {
        dense.layers.push_back(linear->enable_fp8(dense.context));
        dense.slots.push_back(slot++);
      }
      if (block.moe) {
        const MoeLayer::Fp8Layers moe = block.moe->enable_fp8(experts.context, dense.context);
        for (Fp8Linear* shared : moe.shared) {
          dense.layers.push_back(shared);
          dense.slots.push_back(slot++);
        }
        const int64_t first =
            first_expert_slot + (moe_ordinal[static_cast<size_t>(layer)] * config_.n_experts +
                                 block.moe->spec().first_expert()) *
                                    3;
        for (size_t k = 0; k < moe.experts.size(); ++k) {
          experts.layers.push_back(moe.experts[k]);
          experts.slots.push_back(first + static_cast<int64_t>(k));
        }
      }
      LOOM_CHECK(slot == first_dense[static_cast<size_t>(layer) + 1], "enable_fp8: layer ", layer,
                 " has ", slot - first_dense[static_cast<size_t>(layer)], " FP8 projections, ",
                 dense_fp8_layers(config_, layer), " expected");
    }
  std::vector<Fp8LayerGroup> groups = {std::move(dense)};
  if (config_.is_moe()) groups.push_back(std::move(experts));  // every rank: see Fp8Training
  fp8_ = std::make_unique<Fp8Training>(std::move(groups), model_layers);
  return *fp8_;
}

}  // namespace loom
