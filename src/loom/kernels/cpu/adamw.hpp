#pragma once
// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, matching torch.optim.AdamW:
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cstdint>

namespace loom::cpu {

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
  float grad_multiplier = 1.0f;  // gradient clipping folded in: one pass over the gradients fewer
};

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step);

}  // namespace loom::cpu
