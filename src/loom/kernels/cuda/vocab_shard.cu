#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/vocab_shard.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

#define LOOM_GRID_STRIDE(idx, total)                                                \
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < (total); \
       idx += int64_t{gridDim.x} * blockDim.x)

template <typename T>
__global__ void shard_lookup_kernel(T* out, const int32_t* tokens, const T* table, int64_t rows,
                                    int64_t dim, int64_t begin, int64_t end) {
  LOOM_GRID_STRIDE(idx, rows * dim) {
    const int64_t row = idx / dim, i = idx % dim, t = tokens[row];
    out[idx] = (t >= begin && t < end) ? table[(t - begin) * dim + i] : from_f32<T>(0.0f);
  }
}

template <typename T>
__global__ void shard_lookup_grad_kernel(float* d_table, const T* d_out, const int32_t* tokens,
                                         int64_t rows, int64_t dim, int64_t begin, int64_t end) {
  LOOM_GRID_STRIDE(idx, rows * dim) {
    const int64_t row = idx / dim, i = idx % dim, t = tokens[row];
    if (t >= begin && t < end) atomicAdd(d_table + (t - begin) * dim + i, to_f32(d_out[idx]));
  }
}

template <typename T>
__global__ void position_rows_kernel(T* out, const T* table, int64_t rows, int64_t dim,
                                     int64_t first_row, int64_t seq_len, const int32_t* positions) {
  LOOM_GRID_STRIDE(idx, rows * dim) {
    const int64_t row = idx / dim, i = idx % dim;
    const int64_t pos = positions ? positions[row] : (first_row + row) % seq_len;
    out[idx] = from_f32<T>(to_f32(out[idx]) + to_f32(table[pos * dim + i]));
  }
}

template <typename T>
__global__ void position_ids_grad_kernel(float* d_table, const T* d_out, int64_t rows, int64_t dim,
                                         const int32_t* positions) {
  LOOM_GRID_STRIDE(idx, rows * dim) {
    const int64_t row = idx / dim, i = idx % dim;
    atomicAdd(d_table + static_cast<int64_t>(positions[row]) * dim + i, to_f32(d_out[idx]));
  }
}

template <typename T>
__global__ void position_rows_grad_kernel(float* d_table, const T* d_out, int64_t rows, int64_t dim,
                                          int64_t first_row, int64_t seq_len) {
  LOOM_GRID_STRIDE(idx, seq_len * dim) {
    const int64_t p = idx / dim, i = idx % dim;
    // Rows r with (first_row + r) % seq_len == p: r = (p - first_row) mod seq_len, + k seq_len.
    const int64_t start = ((p - first_row) % seq_len + seq_len) % seq_len;
    float sum = 0.0f;
    for (int64_t r = start; r < rows; r += seq_len) sum += to_f32(d_out[r * dim + i]);
    d_table[idx] += sum;
  }
}

template <typename T>
__global__ void add_row_vector_kernel(T* out, const T* v, int64_t rows, int64_t width) {
  LOOM_GRID_STRIDE(idx, rows * width) {
    out[idx] = from_f32<T>(to_f32(out[idx]) + to_f32(v[idx % width]));
  }
}

#undef LOOM_GRID_STRIDE

template <typename Kernel, typename... Args>
void launch(int64_t total, cudaStream_t stream, Kernel kernel, Args... args) {
  if (total <= 0) return;
  kernel<<<detail::grid_for(total, kThreads), kThreads, 0, stream>>>(args...);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_shard_forward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                             cudaStream_t stream) {
  launch(rows * dim, stream, shard_lookup_kernel<float>, out, tokens, table, rows, dim, vocab_begin,
         vocab_end);
}
void embedding_shard_forward(bf16* out, const int32_t* tokens, const bf16* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                             cudaStream_t stream) {
  launch(rows * dim, stream, shard_lookup_kernel<bf16>, out, tokens, table, rows, dim, vocab_begin,
         vocab_end);
}
void embedding_shard_backward(float* d_table, const float* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                              cudaStream_t stream) {
  launch(rows * dim, stream, shard_lookup_grad_kernel<float>, d_table, d_out, tokens, rows, dim,
         vocab_begin, vocab_end);
}
void embedding_shard_backward(float* d_table, const bf16* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end,
                              cudaStream_t stream) {
  launch(rows * dim, stream, shard_lookup_grad_kernel<bf16>, d_table, d_out, tokens, rows, dim,
         vocab_begin, vocab_end);
}
void add_position_rows(float* out, const float* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions, cudaStream_t stream) {
  launch(rows * dim, stream, position_rows_kernel<float>, out, table, rows, dim, first_row, seq_len,
         positions);
}
void add_position_rows(bf16* out, const bf16* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions, cudaStream_t stream) {
  launch(rows * dim, stream, position_rows_kernel<bf16>, out, table, rows, dim, first_row, seq_len,
         positions);
}
void position_rows_backward(float* d_table, const float* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions,
                            cudaStream_t stream) {
  if (positions)
    launch(rows * dim, stream, position_ids_grad_kernel<float>, d_table, d_out, rows, dim,
           positions);
  else
    launch(seq_len * dim, stream, position_rows_grad_kernel<float>, d_table, d_out, rows, dim,
           first_row, seq_len);
}
void position_rows_backward(float* d_table, const bf16* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions,
                            cudaStream_t stream) {
  if (positions)
    launch(rows * dim, stream, position_ids_grad_kernel<bf16>, d_table, d_out, rows, dim,
           positions);
  else
    launch(seq_len * dim, stream, position_rows_grad_kernel<bf16>, d_table, d_out, rows, dim,
           first_row, seq_len);
}
void add_row_vector(float* out, const float* v, int64_t rows, int64_t width, cudaStream_t stream) {
  launch(rows * width, stream, add_row_vector_kernel<float>, out, v, rows, width);
}
void add_row_vector(bf16* out, const bf16* v, int64_t rows, int64_t width, cudaStream_t stream) {
  launch(rows * width, stream, add_row_vector_kernel<bf16>, out, v, rows, width);
}

}  // namespace loom::cuda
