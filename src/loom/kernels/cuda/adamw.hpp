#pragma once
// AdamW as one fused elementwise kernel, the twin of loom::cpu::adamw_update (same step
// arguments, same f32 arithmetic order). Master weights, gradients and moments are f32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"
#include "loom/kernels/cpu/adamw.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;
// The CPU's step struct (see attention.hpp on calling these qualified: ADL finds cpu's too).
using cpu::AdamWStep;

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step, cudaStream_t stream = current_stream());
// bf16 training: also writes the updated master rounded to bf16 into the model's copy, in the
// same pass (no separate conversion over the parameters).
void adamw_update(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                  float* exp_avg_sq, int64_t n, const AdamWStep& step,
                  cudaStream_t stream = current_stream());

// One tensor of adamw_update_many: adamw_update's arguments (param_bf16 null: no bf16 copy).
struct AdamWTensor {
  float* param;
  bf16* param_bf16;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  AdamWStep step;
};
// adamw_update on `count` tensors in one launch (an optimizer step's hundreds of small tensors
// launched one by one were mostly launch latency), every element with the single call's
// arithmetic and so its bits. 16-byte accesses where a tensor's pointers are aligned for them.
void adamw_update_many(const AdamWTensor* tensors, int64_t count,
                       cudaStream_t stream = current_stream());

}  // namespace loom::cuda
