#pragma once
// Global-norm gradient clipping (Pascanu et al. 2013), as torch.nn.utils.clip_grad_norm_:
// scale every gradient by max_norm / (norm + 1e-6) when the norm exceeds max_norm.
#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// L2 norm of all gradients together, accumulated in double in a fixed order.
double global_grad_norm(const ParameterList& params);
// The groups a model's gradients are spread over besides data parallelism: tensor
// parallelism shards parameters over `tp`, pipeline parallelism gives each stage of `pp` its
// own. Null: one rank.
// Expert parallelism gives each rank of `ep` other experts (Parameter::expert_sharded).
struct ModelParallelGroups {
  ProcessGroup* tp = nullptr;
  ProcessGroup* pp = nullptr;
  ProcessGroup* ep = nullptr;
};
// The norm of the whole model's gradients when `params` are one rank's: squares of sharded
// gradients are summed over tp, replicated ones (the same on every tp rank) counted once, and
// every stage's total summed over pp; experts' squares summed over ep. A pipeline copy
// (Parameter::pipeline_copy) is counted by its owner only.
double global_grad_norm(const ParameterList& params, ModelParallelGroups groups);
// What both data-parallel paths finish their norm with: `sharded` summed over tp, plus
// `replicated` once, plus `experts` summed over ep, summed over pp.
double sum_squares_over_model_parallel(double sharded, double replicated, ModelParallelGroups groups,
                                       double experts = 0.0);

// The factor clipping multiplies gradients by: max_norm / (norm + 1e-6) when the norm exceeds
// max_norm, else 1. max_norm <= 0 disables clipping.
double clip_factor(double norm, double max_norm);
// Scales the gradients in place; returns the norm before clipping.
double clip_grad_norm(const ParameterList& params, double max_norm);

}  // namespace loom
