#pragma once
// Global-norm gradient clipping (Pascanu et al. 2013), as torch.nn.utils.clip_grad_norm_:
// scale every gradient by max_norm / (norm + 1e-6) when the norm exceeds max_norm.
#include "loom/dist/process_group.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// L2 norm of all gradients together, accumulated in double in a fixed order.
double global_grad_norm(const ParameterList& params);
// The same norm when `params` are one tensor-parallel rank's: squares of sharded gradients
// are summed over `tp` (one two-float all-reduce), replicated ones, the same on every tp rank,
// counted once. `tp` may be null (one rank).
double global_grad_norm(const ParameterList& params, ProcessGroup* tp);
// Adds the sums of squares held on other tp ranks: `sharded` is summed over `tp` (null: one
// rank), `replicated` counted once. What both data-parallel paths finish their norm with.
double sum_squares_over_tp(double sharded, double replicated, ProcessGroup* tp);

// The factor clipping multiplies gradients by: max_norm / (norm + 1e-6) when the norm exceeds
// max_norm, else 1. max_norm <= 0 disables clipping.
double clip_factor(double norm, double max_norm);
// Scales the gradients in place; returns the norm before clipping.
double clip_grad_norm(const ParameterList& params, double max_norm);

}  // namespace loom
