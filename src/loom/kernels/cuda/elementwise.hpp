#pragma once
// Vector helpers (residual adds, scaling, gradient norms, dtype conversion), the device twins
// of loom::cpu's elementwise.hpp. bf16 variants compute in f32 and round once on store.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

void add_into(float* dst, const float* src, int64_t n,
              cudaStream_t stream = current_stream());  // dst += src
void add_into(bf16* dst, const bf16* src, int64_t n, cudaStream_t stream = current_stream());
void add(float* out, const float* a, const float* b, int64_t n,
         cudaStream_t stream = current_stream());
void add(bf16* out, const bf16* a, const bf16* b, int64_t n,
         cudaStream_t stream = current_stream());
void scale_inplace(float* x, float factor, int64_t n, cudaStream_t stream = current_stream());
void scale_inplace(bf16* x, float factor, int64_t n, cudaStream_t stream = current_stream());

// Sum of x[i]^2 in double. Deterministic: a fixed grid gives every thread a fixed set of
// elements, block partials are combined in a fixed order, then one block adds the partials.
// Waits for `stream` (the result is returned to the host).
double sum_of_squares(const float* x, int64_t n, cudaStream_t stream = current_stream());
// sum_of_squares of `count` arrays (xs[t] with ns[t] elements), each bit for bit the single
// call's, with one wait for `stream` in all: a gradient norm's per-tensor sums in one go.
void sums_of_squares(double* results, const float* const* xs, const int64_t* ns, int64_t count,
                     cudaStream_t stream = current_stream());

// Round-to-nearest-even conversions (loom::f32_to_bf16 on the host gives the same bits).
void convert(bf16* out, const float* in, int64_t n, cudaStream_t stream = current_stream());
void convert(float* out, const bf16* in, int64_t n, cudaStream_t stream = current_stream());
void round_to_bf16_inplace(float* x, int64_t n, cudaStream_t stream = current_stream());

// dst[r * dst_ld + c] = src[r * src_ld + c] for rows x cols, converting with the rounding above
// where the types differ (a block of columns: the k|v of a fused qkv, a gradient written back).
void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream = current_stream());
void copy_columns(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream = current_stream());
void copy_columns(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream = current_stream());
void copy_columns(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
