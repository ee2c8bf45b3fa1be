#pragma once
// Small vector helpers the modules share (residual adds, gradient norms).
#include <cstdint>

namespace loom::cpu {

void add_into(float* dst, const float* src, int64_t n);              // dst += src
void add(float* out, const float* a, const float* b, int64_t n);     // out = a + b
void scale_inplace(float* x, float factor, int64_t n);               // x *= factor
double sum_of_squares(const float* x, int64_t n);                    // in double, deterministic
void round_to_bf16_inplace(float* x, int64_t n);                     // emulate bf16 storage

}  // namespace loom::cpu
