#pragma once
// Pointwise MLP activations. GELU is the tanh approximation GPT-2 was trained with
// (HF "gelu_new"); SwiGLU is silu(gate) * up (Shazeer 2020, used by Llama).
#include <cstdint>

namespace loom::cpu {

void gelu_forward(float* out, const float* input, int64_t n);
// d_input = d_out * gelu'(input)  (overwrites)
void gelu_backward(float* d_input, const float* d_out, const float* input, int64_t n);

// gate and up are rows of width `dim` with leading dimension `in_ld` (they may live side by
// side in one fused buffer); out is [rows, dim].
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t dim,
                    int64_t in_ld);
// d_gate, d_up (overwrite) share the fused layout of gate/up.
void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t rows, int64_t dim, int64_t in_ld);

}  // namespace loom::cpu
