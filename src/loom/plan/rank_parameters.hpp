#pragma once
// The parameters one rank holds under a layout, counted from the model's parameter list and
// each parameter's placement (ParameterSpec: its part of the model, its block unit, the
// dimension tp splits, whether it is an expert) over the engine's stage split
// (model/pipeline_layout), rather than by dividing totals by tp x pp.
#include <cstdint>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/layout.hpp"

namespace loom::plan {

struct RankParameters {
  double block = 0;    // dense weights of the rank's transformer blocks
  double outer = 0;    // token and position tables, final norm and head on the rank's stages
  double experts = 0;  // expert weights: the rank's 1/ep of them
  int64_t layers = 0;  // blocks the rank holds
  double dense() const { return block + outer; }
  double total() const { return dense() + experts; }
};

// What tp rank 0 (which holds the largest vocabulary block) of pipeline rank `pp_rank` holds.
// `stage_layers` (pp x vp counts) replaces the engine's split (stage_layer_counts) when given.
// `moe_whole_on_tp`: a mixture-of-experts block (router, experts, shared experts) whole on every
// tp rank, as loom's engine keeps it (TrainingJob::experts_whole_on_tp), not split as
// Megatron-Core's expert tensor parallelism does.
RankParameters rank_parameters(const ModelConfig& model, const PlanLayout& layout, int64_t pp_rank,
                               const std::vector<int64_t>& stage_layers = {},
                               bool moe_whole_on_tp = false);
// The pipeline rank holding the most parameters: its gradient reduction and optimizer step are
// the slowest of the step's.
RankParameters heaviest_rank_parameters(const ModelConfig& model, const PlanLayout& layout,
                                        const std::vector<int64_t>& stage_layers = {},
                                        bool moe_whole_on_tp = false);

}  // namespace loom::plan
