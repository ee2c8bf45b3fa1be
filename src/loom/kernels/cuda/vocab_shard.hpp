#pragma once
// Device twins of loom::cpu's vocab_shard.hpp (embedding over a vocabulary shard, learned
// positions of a block of rows, a vector added to every row). Gradients are f32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// out[r] = table[tokens[r] - vocab_begin] for device ids in [vocab_begin, vocab_end), else 0.
void embedding_shard_forward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                             cudaStream_t stream = current_stream());
void embedding_shard_forward(bf16* out, const int32_t* tokens, const bf16* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                             cudaStream_t stream = current_stream());
// d_table[tokens[r] - vocab_begin] += d_out[r] for owned ids (atomicAdd, as embedding_backward).
void embedding_shard_backward(float* d_table, const float* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                              cudaStream_t stream = current_stream());
void embedding_shard_backward(float* d_table, const bf16* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                              cudaStream_t stream = current_stream());
// out[r] += table[(first_row + r) % seq_len], or table[positions[r]] when `positions` (device,
// one per row of this block) is given.
void add_position_rows(float* out, const float* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions = nullptr,
                       cudaStream_t stream = current_stream());
void add_position_rows(bf16* out, const bf16* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions = nullptr,
                       cudaStream_t stream = current_stream());
// d_table[p] += the rows r with (first_row + r) % seq_len == p, added in row order (one thread
// per table element: deterministic); with `positions`, d_table[positions[r]] += d_out[r]
// (atomicAdd, as embedding_backward's).
void position_rows_backward(float* d_table, const float* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions = nullptr,
                            cudaStream_t stream = current_stream());
void position_rows_backward(float* d_table, const bf16* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions = nullptr,
                            cudaStream_t stream = current_stream());
// out[r, :] += v.
void add_row_vector(float* out, const float* v, int64_t rows, int64_t width,
                    cudaStream_t stream = current_stream());
void add_row_vector(bf16* out, const bf16* v, int64_t rows, int64_t width,
                    cudaStream_t stream = current_stream());

}  // namespace loom::cuda
