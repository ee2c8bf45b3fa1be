#include <cuda_fp8.h>

#include <algorithm>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/fp8.hpp"

namespace loom::cuda {

namespace {

using detail::to_f32;

constexpr int kThreads = 256;

// Non-negative floats (and a positive NaN, above +inf) order as their bit patterns do, so the
// max of |x| is an integer atomicMax; fabsf clears a NaN's sign.
__device__ __forceinline__ void atomic_max_nonnegative(float* address, float value) {
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t rows, int64_t cols, int64_t stride) {
  __shared__ float scratch[detail::kWarpSize];
  float m = 0.0f;
  // Rows over blockIdx.y, columns over the threads of blockIdx.x: no 64-bit division per element.
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
         c += int64_t{gridDim.x} * blockDim.x) {
      const float v = fabsf(to_f32(x[r * stride + c]));
      m = __int_as_float(max(__float_as_int(m), __float_as_int(v)));  // NaN-propagating max
    }
  // Block max through the same ordering of bit patterns.
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2)
    m = __int_as_float(
        max(__float_as_int(m), __float_as_int(__shfl_xor_sync(detail::kFullMask, m, offset))));
  const int lane = threadIdx.x % detail::kWarpSize, warp = threadIdx.x / detail::kWarpSize;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float block = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x) / detail::kWarpSize; ++w)
      block = __int_as_float(max(__float_as_int(block), __float_as_int(scratch[w])));
    atomic_max_nonnegative(amax, block);
  }
}


__global__ void scale_kernel(float* scale_pair, const float* amax, float max_finite, int margin) {
  const float a = *amax;
  // cpu::fp8_scale: 1 for a zero or non-finite amax, else max_finite / amax / 2^margin.
  const float scale = (!(a > 0.0f) || !isfinite(a)) ? 1.0f : ldexpf(max_finite / a, -margin);
  scale_pair[0] = 1.0f / scale;  // first: cuBLASLt reads it, and wants it aligned
  scale_pair[1] = scale;
}

// codes and, when asked, codes_t = codes transposed, a 32 x 32 tile per block (32 x 8 threads,
// 4 rows each): the tile's codes are written row by row as they are made and then, through
// shared memory, column by column, so both stores are coalesced. (A byte per thread written
// straight to codes_t[c * rows + r] touched one 32-byte sector per byte.) Tile rows beyond
// gridDim.y's limit are taken in a grid-stride loop.
constexpr int kTile = 32, kTileRows = 8;
template <typename T>
__global__ void quantize_kernel(uint8_t* codes, uint8_t* codes_t, const T* x, int64_t rows,
                                int64_t cols, int64_t stride, const float* scale_pair,
                                __nv_fp8_interpretation_t kind) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // a row of 36 bytes: column reads hit 32 banks
  const float scale = scale_pair[1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile;
  for (int64_t r0 = int64_t{blockIdx.y} * kTile; r0 < rows; r0 += int64_t{gridDim.y} * kTile) {
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const auto code = static_cast<uint8_t>(
            __nv_cvt_float_to_fp8(to_f32(x[r * stride + c]) * scale, __NV_SATFINITE, kind));
        codes[r * cols + c] = code;
        tile[j][threadIdx.x] = code;
      }
    }
    if (codes_t) {  // the same for the whole block, so are the barriers
      __syncthreads();
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {
        const int64_t c = c0 + j, r = r0 + threadIdx.x;
        if (c < cols && r < rows) codes_t[c * rows + r] = tile[threadIdx.x][j];
      }
      __syncthreads();
    }
  }
}

__nv_fp8_interpretation_t interpretation(cpu::Fp8Format format) {
  return format == cpu::Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

template <typename T>
void amax_impl(float* amax, const T* x, int64_t rows, int64_t cols, int64_t stride,
               cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(cols, kThreads), 64)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 2048)));
  amax_kernel<<<grid, kThreads, 0, stream>>>(amax, x, rows, cols, stride);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void quantize_impl(uint8_t* codes, uint8_t* codes_t, const T* x, int64_t rows, int64_t cols,
                   int64_t stride, const float* scale_pair, cpu::Fp8Format format,
                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(cols, kTile)),
                  static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(rows, kTile), 65535)));
  quantize_kernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(
      codes, codes_t, x, rows, cols, stride, scale_pair, interpretation(format));
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_amax(float* amax, const bf16* x, int64_t rows, int64_t cols, int64_t stride,
              cudaStream_t stream) {
  amax_impl(amax, x, rows, cols, stride, stream);
}
void fp8_amax(float* amax, const float* x, int64_t rows, int64_t cols, int64_t stride,
              cudaStream_t stream) {
  amax_impl(amax, x, rows, cols, stride, stream);
}

void fp8_scale_from_amax(float* scale_pair, const float* amax, cpu::Fp8Format format, int margin,
                         cudaStream_t stream) {
  scale_kernel<<<1, 1, 0, stream>>>(scale_pair, amax, cpu::fp8_spec(format).max_finite, margin);
  LOOM_CUDA_CHECK_LAUNCH();
}

void fp8_quantize(uint8_t* codes, uint8_t* codes_t, const bf16* x, int64_t rows, int64_t cols,
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format,
                  cudaStream_t stream) {
  quantize_impl(codes, codes_t, x, rows, cols, stride, scale_pair, format, stream);
}
void fp8_quantize(uint8_t* codes, uint8_t* codes_t, const float* x, int64_t rows, int64_t cols,
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format,
                  cudaStream_t stream) {
  quantize_impl(codes, codes_t, x, rows, cols, stride, scale_pair, format, stream);
}

}  // namespace loom::cuda
