#pragma once
// Token (and learned position) embedding on the device, the twin of loom::cpu's embedding.hpp.
// Table gradients are f32 in both variants.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// out[b*t, dim] = token_table[tokens[b*t]] (+ position_table[t] when position_table != null;
// position_table[positions[b*t]] when `positions` (device, one per token) is given too).
void embedding_forward(float* out, const int32_t* tokens, const float* token_table,
                       const float* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions = nullptr, cudaStream_t stream = current_stream());
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* token_table,
                       const bf16* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions = nullptr, cudaStream_t stream = current_stream());

// d_token_table[tokens[i]] += d_out[i] (atomicAdd: repeated tokens add in an unspecified
// order, so the last bits may vary between runs); d_position_table[t] += sum over the batch
// of d_out[b, t] (one thread per element, batch in order: deterministic), or, with `positions`,
// d_position_table[positions[i]] += d_out[i] (atomicAdd, as for the tokens). Either table may be
// null.
void embedding_backward(float* d_token_table, float* d_position_table, const float* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions = nullptr, cudaStream_t stream = current_stream());
void embedding_backward(float* d_token_table, float* d_position_table, const bf16* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions = nullptr, cudaStream_t stream = current_stream());

}  // namespace loom::cuda
