#pragma once
// Elements per token of one layer's activation stash, by how each part shards: shared by the
// GPU memory model (memory_model.cpp) and the engine's (engine_memory.cpp).
#include "loom/model/config.hpp"

namespace loom::plan {

// Elements per token of one layer's stash, split by how each part shards.
struct LayerElements {
  double replicated_by_tp;  // layer input, norm outputs and statistics, mid residual (divide by t under SP)
  double split_by_tp;       // q|k|v, MLP pre-activation: always divided by t
  double recomputable;      // attention output, log-sum-exp, MLP activation (dropped by selective)
  // Of those, the inputs of Linear layers (saved in 1 byte under FP8): the two norm outputs
  // (in replicated_by_tp) and the attention output and MLP activation (in recomputable).
  double linear_replicated, linear_recomputable;
  // Linear inputs among split_by_tp (a hybrid's Mamba out_proj input, a hybrid MoE block's
  // dispatched copies).
  double linear_split = 0;
};

// One layer's elements: a mixture-of-experts layer's (`moe_layer`) or a dense one's.
LayerElements layer_elements_of(const ModelConfig& m, bool moe_layer);

}  // namespace loom::plan
