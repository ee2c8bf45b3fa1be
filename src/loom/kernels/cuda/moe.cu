// Mixture-of-experts row movement on the device (moe.hpp): grid-stride loops over elements,
// one warp per slot for the weights' gradients.
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/moe.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

#define LOOM_GRID_STRIDE(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

template <typename T>
__global__ void gather_kernel(T* routed, const T* x, const int32_t* position, int64_t slots,
                              int64_t k, int64_t c) {
  LOOM_GRID_STRIDE(idx, slots * c) {
    const int64_t slot = idx / c, j = idx % c;
    const int32_t p = position[slot];
    if (p >= 0) routed[int64_t{p} * c + j] = x[(slot / k) * c + j];
  }
}

template <typename T>
__global__ void gather_backward_kernel(T* d_x, const T* d_routed, const int32_t* position,
                                       int64_t rows, int64_t k, int64_t c) {
  LOOM_GRID_STRIDE(idx, rows * c) {
    const int64_t t = idx / c, j = idx % c;
    float acc = to_f32(d_x[idx]);
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = position[t * k + q];
      if (p >= 0) acc += to_f32(d_routed[int64_t{p} * c + j]);
    }
    d_x[idx] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void combine_kernel(T* out, const T* expert_out, const float* weights,
                               const int32_t* position, int64_t rows, int64_t k, int64_t c) {
  LOOM_GRID_STRIDE(idx, rows * c) {
    const int64_t t = idx / c, j = idx % c;
    float acc = 0.0f;
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = position[t * k + q];
      if (p >= 0) acc += weights[t * k + q] * to_f32(expert_out[int64_t{p} * c + j]);
    }
    out[idx] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void combine_grad_rows_kernel(T* d_expert_out, const T* d_out, const float* weights,
                                         const int32_t* position, int64_t slots, int64_t k,
                                         int64_t c) {
  LOOM_GRID_STRIDE(idx, slots * c) {
    const int64_t slot = idx / c, j = idx % c;
    const int32_t p = position[slot];
    if (p >= 0)
      d_expert_out[int64_t{p} * c + j] =
          from_f32<T>(weights[slot] * to_f32(d_out[(slot / k) * c + j]));
  }
}

// One warp per slot: d_weights[slot] = d_out[t] . expert_out[p], 0 for a dropped slot.
template <typename T>
__global__ void combine_grad_weights_kernel(float* d_weights, const T* d_out, const T* expert_out,
                                            const int32_t* position, int64_t slots, int64_t k,
                                            int64_t c) {
  const int64_t slot = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / detail::kWarpSize;
  const int lane = threadIdx.x % detail::kWarpSize;
  if (slot >= slots) return;
  const int32_t p = position[slot];
  float sum = 0.0f;
  if (p >= 0)
    for (int64_t j = lane; j < c; j += detail::kWarpSize)
      sum += to_f32(d_out[(slot / k) * c + j]) * to_f32(expert_out[int64_t{p} * c + j]);
  sum = detail::warp_sum(sum);
  if (lane == 0) d_weights[slot] = sum;
}

#undef LOOM_GRID_STRIDE

template <typename Kernel, typename... Args>
void launch(int64_t total, cudaStream_t stream, Kernel kernel, Args... args) {
  if (total <= 0) return;
  kernel<<<detail::grid_for(total, kThreads), kThreads, 0, stream>>>(args...);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void moe_gather(T* routed, const T* x, const int32_t* position, int64_t rows, int64_t k, int64_t c,
                cudaStream_t stream) {
  launch(rows * k * c, stream, gather_kernel<T>, routed, x, position, rows * k, k, c);
}
template <typename T>
void moe_gather_backward(T* d_x, const T* d_routed, const int32_t* position, int64_t rows,
                         int64_t k, int64_t c, cudaStream_t stream) {
  launch(rows * c, stream, gather_backward_kernel<T>, d_x, d_routed, position, rows, k, c);
}
template <typename T>
void moe_combine(T* out, const T* expert_out, const float* weights, const int32_t* position,
                 int64_t rows, int64_t k, int64_t c, cudaStream_t stream) {
  launch(rows * c, stream, combine_kernel<T>, out, expert_out, weights, position, rows, k, c);
}
template <typename T>
void moe_combine_backward(T* d_expert_out, float* d_weights, const T* d_out, const T* expert_out,
                          const float* weights, const int32_t* position, int64_t rows, int64_t k,
                          int64_t c, cudaStream_t stream) {
  launch(rows * k * c, stream, combine_grad_rows_kernel<T>, d_expert_out, d_out, weights, position,
         rows * k, k, c);
  const int64_t slots = rows * k;
  if (slots <= 0) return;
  constexpr int kSlotsPerBlock = kThreads / detail::kWarpSize;
  combine_grad_weights_kernel<T>
      <<<static_cast<unsigned>(detail::ceil_div(slots, kSlotsPerBlock)), kThreads, 0, stream>>>(
          d_weights, d_out, expert_out, position, slots, k, c);
  LOOM_CUDA_CHECK_LAUNCH();
}

#define LOOM_MOE_KERNELS(T)                                                                     \
  template void moe_gather<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t,          \
                              cudaStream_t);                                                    \
  template void moe_gather_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                       cudaStream_t);                                           \
  template void moe_combine<T>(T*, const T*, const float*, const int32_t*, int64_t, int64_t,    \
                               int64_t, cudaStream_t);                                          \
  template void moe_combine_backward<T>(T*, float*, const T*, const T*, const float*,           \
                                        const int32_t*, int64_t, int64_t, int64_t, cudaStream_t);
LOOM_MOE_KERNELS(float)
LOOM_MOE_KERNELS(bf16)
#undef LOOM_MOE_KERNELS

}  // namespace loom::cuda
