#pragma once
// Global-norm gradient clipping (Pascanu et al. 2013), as torch.nn.utils.clip_grad_norm_:
// scale every gradient by max_norm / (norm + 1e-6) when the norm exceeds max_norm.
#include "loom/model/parameter.hpp"

namespace loom {

// L2 norm of all gradients together, accumulated in double in a fixed order.
double global_grad_norm(const ParameterList& params);
// The factor clipping multiplies gradients by: max_norm / (norm + 1e-6) when the norm exceeds
// max_norm, else 1. max_norm <= 0 disables clipping.
double clip_factor(double norm, double max_norm);
// Scales the gradients in place; returns the norm before clipping.
double clip_grad_norm(const ParameterList& params, double max_norm);

}  // namespace loom
