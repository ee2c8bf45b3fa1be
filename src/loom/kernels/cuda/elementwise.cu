#include <algorithm>
#include <type_traits>
#include <vector>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/elementwise.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

// One grid-stride loop for every pointwise helper; `op(i)` does element i.
template <typename Op>
__global__ void pointwise_kernel(int64_t n, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    op(i);
}

template <typename Op>
void launch_pointwise(int64_t n, cudaStream_t stream, Op op) {
  if (n <= 0) return;
  pointwise_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(n, op);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void add_into_impl(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  launch_pointwise(n, stream, [=] __device__(int64_t i) {
    dst[i] = from_f32<T>(to_f32(dst[i]) + to_f32(src[i]));
  });
}
template <typename T>
void add_impl(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  launch_pointwise(
      n, stream, [=] __device__(int64_t i) { out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i])); });
}
template <typename T>
void scale_impl(T* x, float factor, int64_t n, cudaStream_t stream) {
  launch_pointwise(n, stream,
                   [=] __device__(int64_t i) { x[i] = from_f32<T>(to_f32(x[i]) * factor); });
}

// The partial count is a constant, not derived from the GPU's SM count, so the summation
// order (and the result's last bits) is the same on every device.
constexpr int kSumBlocks = 256;

// Partial `block` of `blocks` of the sum of x[i]^2: the block's threads take every
// (blocks * blockDim.x)-th element from their own offset, then block_sum combines them in its
// fixed order. The single and the batched kernels both call this, so a tensor's partials have
// the same bits whichever computed them. Unrolled so that four loads are in flight before the
// first add waits (inside the batched kernel's loop over tensors the compiler left it rolled,
// a whole memory latency per element); the adds stay one chain in element order.
__device__ double sum_of_squares_partial(const float* x, int64_t n, int64_t block, int64_t blocks,
                                         double* scratch) {
  double sum = 0.0;
#pragma unroll 4
  for (int64_t i = block * blockDim.x + threadIdx.x; i < n; i += blocks * blockDim.x)
    sum += static_cast<double>(x[i]) * x[i];
  return detail::block_sum(sum, scratch);
}

// The sum of `count` partials, in block_sum's order (shared like sum_of_squares_partial).
__device__ double sum_of_partials(const double* partials, int count, double* scratch) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  return detail::block_sum(sum, scratch);
}

__global__ void sum_of_squares_partials(double* partials, const float* x, int64_t n) {
  __shared__ double scratch[detail::kWarpSize];
  const double sum = sum_of_squares_partial(x, n, blockIdx.x, gridDim.x, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void sum_partials(double* result, const double* partials, int count) {
  __shared__ double scratch[detail::kWarpSize];
  const double sum = sum_of_partials(partials, count, scratch);
  if (threadIdx.x == 0) *result = sum;
}

// One tensor of sums_of_squares, as the batched kernels read it from the device table.
struct SumSlice {
  const float* x;
  int64_t n;
};

// The most blocks a grid dimension is given here (gridDim.y's limit); tensors beyond it are
// taken by the same blocks in further turns of their loop.
constexpr int64_t kMaxGridRows = 65535;

// sum_of_squares_partials for every tensor in one launch: block (b, y) writes partial b of the
// tensors y, y + gridDim.y, ... into row t of partials [count, kSumBlocks]. gridDim.x is
// kSumBlocks, so each thread reads exactly the elements it reads in the single call.
__global__ void sums_of_squares_partials(double* partials, const SumSlice* slices, int64_t count) {
  __shared__ double scratch[detail::kWarpSize];
  for (int64_t t = blockIdx.y; t < count; t += gridDim.y) {
    const SumSlice slice = slices[t];
    double* out = partials + t * kSumBlocks + blockIdx.x;
    // A block past the tensor's end (most blocks of a bias) would sum nothing but zeros, and
    // block_sum of +0.0s is +0.0: write that without the reduction. The test is the same for
    // every thread of the block, so block_sum's barriers stay block-wide.
    if (int64_t{blockIdx.x} * blockDim.x >= slice.n) {
      if (threadIdx.x == 0) *out = 0.0;
      continue;
    }
    const double sum = sum_of_squares_partial(slice.x, slice.n, blockIdx.x, kSumBlocks, scratch);
    if (threadIdx.x == 0) *out = sum;
  }
}

// sum_partials for every tensor: block x adds rows x, x + gridDim.x, ... of partials.
__global__ void sums_of_partials(double* sums, const double* partials, int64_t count) {
  __shared__ double scratch[detail::kWarpSize];
  for (int64_t t = blockIdx.x; t < count; t += gridDim.x) {
    const double sum = sum_of_partials(partials + t * kSumBlocks, kSumBlocks, scratch);
    if (threadIdx.x == 0) sums[t] = sum;
  }
}

}  // namespace

void add_into(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  add_into_impl(dst, src, n, stream);
}
void add_into(bf16* dst, const bf16* src, int64_t n, cudaStream_t stream) {
  add_into_impl(dst, src, n, stream);
}
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  add_impl(out, a, b, n, stream);
}
void add(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  add_impl(out, a, b, n, stream);
}
void scale_inplace(float* x, float factor, int64_t n, cudaStream_t stream) {
  scale_impl(x, factor, n, stream);
}
void scale_inplace(bf16* x, float factor, int64_t n, cudaStream_t stream) {
  scale_impl(x, factor, n, stream);
}

double sum_of_squares(const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return 0.0;
  detail::ScratchBuffer<double> partials(kSumBlocks + 1, stream);
  double* result_device = partials.get() + kSumBlocks;
  sum_of_squares_partials<<<kSumBlocks, kThreads, 0, stream>>>(partials.get(), x, n);
  LOOM_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, kThreads, 0, stream>>>(result_device, partials.get(), kSumBlocks);
  LOOM_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(&result, result_device, sizeof result, cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void sums_of_squares(double* results, const float* const* xs, const int64_t* ns, int64_t count,
                     cudaStream_t stream) {
  if (count <= 0) return;
  // Two launches for all the tensors (a launch per tensor and kernel was a GPT-2 step's 296
  // launches): every tensor's partials exactly as sum_of_squares computes them, then every
  // tensor's sum of its partials as sum_partials adds them, then one copy back and one wait.
  // The (pointer, size) table goes up with the work: a launch's arguments cannot hold it.
  std::vector<SumSlice> host(static_cast<size_t>(count));
  for (int64_t t = 0; t < count; ++t)
    host[static_cast<size_t>(t)] = {xs[t], std::max<int64_t>(ns[t], 0)};  // empty: sum 0
  detail::ScratchBuffer<SumSlice> table(count, stream);
  detail::ScratchBuffer<double> scratch(count * (kSumBlocks + 1), stream);
  double* sums = scratch.get() + count * kSumBlocks;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(table.get(), host.data(),
                                  static_cast<size_t>(count) * sizeof(SumSlice),
                                  cudaMemcpyHostToDevice, stream));
  const auto rows = static_cast<unsigned>(std::min(count, kMaxGridRows));
  sums_of_squares_partials<<<dim3(kSumBlocks, rows), kThreads, 0, stream>>>(scratch.get(),
                                                                            table.get(), count);
  LOOM_CUDA_CHECK_LAUNCH();
  sums_of_partials<<<rows, kThreads, 0, stream>>>(sums, scratch.get(), count);
  LOOM_CUDA_CHECK_LAUNCH();
  LOOM_CUDA_CHECK(cudaMemcpyAsync(results, sums, static_cast<size_t>(count) * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void convert(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  launch_pointwise(n, stream, [=] __device__(int64_t i) { out[i] = __float2bfloat16_rn(in[i]); });
}
void convert(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  launch_pointwise(n, stream, [=] __device__(int64_t i) { out[i] = __bfloat162float(in[i]); });
}
void round_to_bf16_inplace(float* x, int64_t n, cudaStream_t stream) {
  launch_pointwise(
      n, stream, [=] __device__(int64_t i) { x[i] = __bfloat162float(__float2bfloat16_rn(x[i])); });
}

namespace {
template <typename TD, typename TS>
void copy_columns_impl(TD* dst, int64_t dst_ld, const TS* src, int64_t src_ld, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if constexpr (std::is_same_v<TD, TS>) {
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_ld) * sizeof(TD), src,
                                      static_cast<size_t>(src_ld) * sizeof(TS),
                                      static_cast<size_t>(cols) * sizeof(TS),
                                      static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
  } else {
    launch_pointwise(rows * cols, stream, [=] __device__(int64_t i) {
      const int64_t r = i / cols, c = i % cols;
      dst[r * dst_ld + c] = from_f32<TD>(to_f32(src[r * src_ld + c]));
    });
  }
}
}  // namespace

void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream) {
  copy_columns_impl(dst, dst_ld, src, src_ld, rows, cols, stream);
}
void copy_columns(bf16* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream) {
  copy_columns_impl(dst, dst_ld, src, src_ld, rows, cols, stream);
}
void copy_columns(float* dst, int64_t dst_ld, const bf16* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream) {
  copy_columns_impl(dst, dst_ld, src, src_ld, rows, cols, stream);
}
void copy_columns(bf16* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t stream) {
  copy_columns_impl(dst, dst_ld, src, src_ld, rows, cols, stream);
}

}  // namespace loom::cuda
