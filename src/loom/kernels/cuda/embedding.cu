#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/embedding.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* token_table,
                                         const T* position_table, int64_t rows, int64_t seq_len,
                                         int64_t dim, const int32_t* positions) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < rows * dim;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / dim, i = idx % dim;
    float v = to_f32(token_table[static_cast<int64_t>(tokens[row]) * dim + i]);
    if (position_table) {
      const int64_t pos = positions ? positions[row] : row % seq_len;
      v += to_f32(position_table[pos * dim + i]);
    }
    out[idx] = from_f32<T>(v);
  }
}

// d_table[ids[row]] += d_out[row]: token ids, or position ids (packed documents, cp chunks).
template <typename T>
__global__ void token_grad_kernel(float* d_token_table, const T* d_out, const int32_t* tokens,
                                  int64_t rows, int64_t dim) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < rows * dim;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = idx / dim, i = idx % dim;
    atomicAdd(d_token_table + static_cast<int64_t>(tokens[row]) * dim + i, to_f32(d_out[idx]));
  }
}

template <typename T>
__global__ void position_grad_kernel(float* d_position_table, const T* d_out, int64_t batch,
                                     int64_t seq_len, int64_t dim) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < seq_len * dim;
       idx += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int64_t b = 0; b < batch; ++b) sum += to_f32(d_out[b * seq_len * dim + idx]);
    d_position_table[idx] += sum;
  }
}

template <typename T>
void forward_impl(T* out, const int32_t* tokens, const T* token_table, const T* position_table,
                  int64_t batch, int64_t seq_len, int64_t dim, const int32_t* positions,
                  cudaStream_t stream) {
  const int64_t total = batch * seq_len * dim;
  if (total <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(total, kThreads), kThreads, 0, stream>>>(
      out, tokens, token_table, position_table, batch * seq_len, seq_len, dim, positions);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(float* d_token_table, float* d_position_table, const T* d_out,
                   const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                   const int32_t* positions, cudaStream_t stream) {
  if (batch * seq_len * dim <= 0) return;
  if (d_token_table) {
    token_grad_kernel<<<detail::grid_for(batch * seq_len * dim, kThreads), kThreads, 0, stream>>>(
        d_token_table, d_out, tokens, batch * seq_len, dim);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (d_position_table && positions) {
    token_grad_kernel<<<detail::grid_for(batch * seq_len * dim, kThreads), kThreads, 0, stream>>>(
        d_position_table, d_out, positions, batch * seq_len, dim);
    LOOM_CUDA_CHECK_LAUNCH();
  } else if (d_position_table) {
    position_grad_kernel<<<detail::grid_for(seq_len * dim, kThreads), kThreads, 0, stream>>>(
        d_position_table, d_out, batch, seq_len, dim);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* token_table,
                       const float* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions, cudaStream_t stream) {
  forward_impl(out, tokens, token_table, position_table, batch, seq_len, dim, positions, stream);
}
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* token_table,
                       const bf16* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions, cudaStream_t stream) {
  forward_impl(out, tokens, token_table, position_table, batch, seq_len, dim, positions, stream);
}
void embedding_backward(float* d_token_table, float* d_position_table, const float* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions, cudaStream_t stream) {
  backward_impl(d_token_table, d_position_table, d_out, tokens, batch, seq_len, dim, positions,
                stream);
}
void embedding_backward(float* d_token_table, float* d_position_table, const bf16* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions, cudaStream_t stream) {
  backward_impl(d_token_table, d_position_table, d_out, tokens, batch, seq_len, dim, positions,
                stream);
}

}  // namespace loom::cuda
