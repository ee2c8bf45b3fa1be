#include "loom/kernels/cuda/activations.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// Accurate tanhf/expf (not the __ intrinsics): the CPU reference uses ~2-ulp approximations,
// and the f32 tests compare at 1e-5.
template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* input, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(input[i]);
    out[i] = from_f32<T>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* d_input, const T* d_out, const T* input, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(input[i]);
    const float t = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
    d_input[i] = from_f32<T>(to_f32(d_out[i]) * grad);
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t rows, int64_t dim,
                                      int64_t in_ld) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * dim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = (i / dim) * in_ld + i % dim;
    const float g = to_f32(gate[at]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[at]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* d_gate, T* d_up, const T* d_out, const T* gate,
                                       const T* up, int64_t rows, int64_t dim, int64_t in_ld) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * dim;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = (i / dim) * in_ld + i % dim;
    const float g = to_f32(gate[at]), u = to_f32(up[at]), dy = to_f32(d_out[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    d_up[at] = from_f32<T>(dy * (g * sig));
    d_gate[at] = from_f32<T>(dy * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

template <typename T>
void gelu_forward_impl(T* out, const T* input, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_forward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(out, input, n);
  LOOM_CUDA_CHECK_LAUNCH();
}
template <typename T>
void gelu_backward_impl(T* d_input, const T* d_out, const T* input, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return;
  gelu_backward_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(d_input, d_out,
                                                                               input, n);
  LOOM_CUDA_CHECK_LAUNCH();
}
template <typename T>
void swiglu_forward_impl(T* out, const T* gate, const T* up, int64_t rows, int64_t dim,
                         int64_t in_ld, cudaStream_t stream) {
  if (rows * dim <= 0) return;
  swiglu_forward_kernel<<<detail::grid_for(rows * dim, kThreads), kThreads, 0, stream>>>(
      out, gate, up, rows, dim, in_ld);
  LOOM_CUDA_CHECK_LAUNCH();
}
template <typename T>
void swiglu_backward_impl(T* d_gate, T* d_up, const T* d_out, const T* gate, const T* up,
                          int64_t rows, int64_t dim, int64_t in_ld, cudaStream_t stream) {
  if (rows * dim <= 0) return;
  swiglu_backward_kernel<<<detail::grid_for(rows * dim, kThreads), kThreads, 0, stream>>>(
      d_gate, d_up, d_out, gate, up, rows, dim, in_ld);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gelu_forward(float* out, const float* input, int64_t n, cudaStream_t stream) {
  gelu_forward_impl(out, input, n, stream);
}
void gelu_forward(bf16* out, const bf16* input, int64_t n, cudaStream_t stream) {
  gelu_forward_impl(out, input, n, stream);
}
void gelu_backward(float* d_input, const float* d_out, const float* input, int64_t n,
                   cudaStream_t stream) {
  gelu_backward_impl(d_input, d_out, input, n, stream);
}
void gelu_backward(bf16* d_input, const bf16* d_out, const bf16* input, int64_t n,
                   cudaStream_t stream) {
  gelu_backward_impl(d_input, d_out, input, n, stream);
}
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t dim,
                    int64_t in_ld, cudaStream_t stream) {
  swiglu_forward_impl(out, gate, up, rows, dim, in_ld, stream);
}
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t rows, int64_t dim,
                    int64_t in_ld, cudaStream_t stream) {
  swiglu_forward_impl(out, gate, up, rows, dim, in_ld, stream);
}
void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                     const float* up, int64_t rows, int64_t dim, int64_t in_ld,
                     cudaStream_t stream) {
  swiglu_backward_impl(d_gate, d_up, d_out, gate, up, rows, dim, in_ld, stream);
}
void swiglu_backward(bf16* d_gate, bf16* d_up, const bf16* d_out, const bf16* gate, const bf16* up,
                     int64_t rows, int64_t dim, int64_t in_ld, cudaStream_t stream) {
  swiglu_backward_impl(d_gate, d_up, d_out, gate, up, rows, dim, in_ld, stream);
}

}  // namespace loom::cuda
