#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/error.hpp"
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

// max(a, b) of non-negative floats (or a positive NaN, which wins) through their bit patterns.
__device__ __forceinline__ float bits_max(float a, float b) {
  return __int_as_float(max(__float_as_int(a), __float_as_int(b)));
}

// Folds each thread's m into *amax: the warp's max by shuffles, the block's through shared
// memory, one atomic per block. Every thread of the block calls it (blockDim.x * blockDim.y a
// multiple of 32, at most 1024).
__device__ __forceinline__ void block_max_into(float* amax, float m) {
  __shared__ float scratch[detail::kWarpSize];
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2)
    m = bits_max(m, __shfl_xor_sync(detail::kFullMask, m, offset));
  const int thread = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  const int lane = thread % detail::kWarpSize, warp = thread / detail::kWarpSize;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (thread == 0) {
    float block = 0.0f;
    const int warps = static_cast<int>(blockDim.x * blockDim.y) / detail::kWarpSize;
    for (int w = 0; w < warps; ++w) block = bits_max(block, scratch[w]);
    atomic_max_nonnegative(amax, block);
  }
}

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t rows, int64_t cols, int64_t stride) {
  float m = 0.0f;
  // Rows over blockIdx.y, columns over the threads of blockIdx.x: no 64-bit division per element.
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
         c += int64_t{gridDim.x} * blockDim.x)
      m = bits_max(m, fabsf(to_f32(x[r * stride + c])));  // NaN-propagating
  block_max_into(amax, m);
}

// The same over 16-byte groups (cols, stride and x all multiples of 16 bytes): a 4096 x 2048
// bf16 block took 27 us in the scalar kernel above on an H100 (600 GB/s), grid-bound on one
// element per thread and 16,384 atomics.
template <typename T>
__global__ void amax_kernel_16b(float* amax, const T* x, int64_t rows, int64_t groups,
                                int64_t group_stride) {
  constexpr int kPer = 16 / sizeof(T);
  const auto* g = reinterpret_cast<const uint4*>(x);
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < groups;
         c += int64_t{gridDim.x} * blockDim.x) {
      const uint4 v = g[r * group_stride + c];
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int k = 0; k < kPer; ++k) m = bits_max(m, fabsf(to_f32(e[k])));
    }
  block_max_into(amax, m);
}

// cpu::fp8_scale: 1 for a zero or non-finite amax, else max_finite / amax / 2^margin, FLT_MAX
// where that overflows.
__device__ __forceinline__ float device_fp8_scale(float amax, float max_finite, int margin) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
  const float scale = ldexpf(max_finite / amax, -margin);
  return isinf(scale) ? FLT_MAX : scale;
}

__global__ void scale_kernel(float* scale_pair, const float* amax, float max_finite, int margin) {
  const float scale = device_fp8_scale(*amax, max_finite, margin);
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
                                __nv_fp8_interpretation_t kind, float* amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // a row of 36 bytes: column reads hit 32 banks
  const float scale = scale_pair[1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile;
  float m = 0.0f;  // max |x| of the elements this thread reads, when amax is asked for
  for (int64_t r0 = int64_t{blockIdx.y} * kTile; r0 < rows; r0 += int64_t{gridDim.y} * kTile) {
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float v = to_f32(x[r * stride + c]);
        m = bits_max(m, fabsf(v));
        const auto code =
            static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind));
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
  if (amax) block_max_into(amax, m);  // the same for the whole block
}

// The same codes 4 columns at a time, for blocks whose cols and stride (and rows, with codes_t)
// are multiples of 4 and whose pointers are aligned to 4 elements: 64 x 64 tiles on 256
// threads (16 x 16), each thread loading 4 adjacent elements of a row in one 8- or 16-byte load
// and storing their 4 codes as one word, and for the transpose gathering 4 adjacent rows of a
// column from shared memory into one word. (The one-element kernel above ran at 1.2-1.3 TB/s on
// an H100 with a transposed copy: a byte per store.)
constexpr int kTile4 = 64, kLanes4 = kTile4 / 4;  // 16 threads across a tile's 64 columns
constexpr int kThreads4 = kLanes4 * kLanes4;      // 16 rows of them

__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&v)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const auto* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(e[k]);
}

template <typename T>
__global__ void quantize4_kernel(uint8_t* codes, uint8_t* codes_t, const T* x, int64_t rows,
                                 int64_t cols, int64_t stride, const float* scale_pair,
                                 __nv_fp8_interpretation_t kind, float* amax) {
  // tile[r][w]: the codes of columns 4w .. 4w + 3 of the tile's row r, one byte each (low first);
  // 17 words a row so the transpose's column reads spread over the banks.
  __shared__ uint32_t tile[kTile4][kLanes4 + 1];
  const float scale = scale_pair[1];
  const int tx = static_cast<int>(threadIdx.x) % kLanes4,
            ty = static_cast<int>(threadIdx.x) / kLanes4;
  const int64_t c0 = int64_t{blockIdx.x} * kTile4;
  float m = 0.0f;
  for (int64_t r0 = int64_t{blockIdx.y} * kTile4; r0 < rows; r0 += int64_t{gridDim.y} * kTile4) {
    for (int j = ty; j < kTile4; j += kLanes4) {
      const int64_t r = r0 + j, c = c0 + 4 * tx;
      uint32_t packed = 0;
      if (r < rows && c < cols) {  // cols % 4 == 0: all four columns are in range
        float v[4];
        load4(x + r * stride + c, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          m = bits_max(m, fabsf(v[k]));
          packed |= static_cast<uint32_t>(static_cast<uint8_t>(
                        __nv_cvt_float_to_fp8(v[k] * scale, __NV_SATFINITE, kind)))
                    << (8 * k);
        }
        *reinterpret_cast<uint32_t*>(codes + r * cols + c) = packed;
      }
      if (codes_t) tile[j][tx] = packed;  // zero out of range: never read then
    }
    if (codes_t) {  // the same for the whole block, so are the barriers
      __syncthreads();
      // Column c0 + j of the tile, rows r0 + 4 tx .. + 3, as one word of codes_t's row c.
      for (int j = ty; j < kTile4; j += kLanes4) {
        const int64_t c = c0 + j, r = r0 + 4 * tx;
        if (c < cols && r < rows) {  // rows % 4 == 0: all four rows are in range
          const int word = j / 4, shift = 8 * (j % 4);
          uint32_t out = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) out |= ((tile[4 * tx + k][word] >> shift) & 0xffu) << (8 * k);
          *reinterpret_cast<uint32_t*>(codes_t + c * rows + r) = out;
        }
      }
      __syncthreads();
    }
  }
  if (amax) block_max_into(amax, m);  // the same for the whole block
}

__nv_fp8_interpretation_t interpretation(cpu::Fp8Format format) {
  return format == cpu::Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

template <typename T>
void amax_impl(float* amax, const T* x, int64_t rows, int64_t cols, int64_t stride,
               cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  // About 1024 blocks in all (8 per SM of an H100), each folding many rows before its one atomic.
  constexpr int64_t kBlocks = 1024;
  constexpr int64_t kPer = 16 / sizeof(T);
  if (cols % kPer == 0 && stride % kPer == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t groups = cols / kPer;
    const int64_t across = std::min<int64_t>(detail::ceil_div(groups, kThreads), 64);
    const dim3 grid(static_cast<unsigned>(across),
                    static_cast<unsigned>(std::min(rows, std::max<int64_t>(1, kBlocks / across))));
    amax_kernel_16b<<<grid, kThreads, 0, stream>>>(amax, x, rows, groups, stride / kPer);
  } else {
    const int64_t across = std::min<int64_t>(detail::ceil_div(cols, kThreads), 64);
    const dim3 grid(static_cast<unsigned>(across),
                    static_cast<unsigned>(std::min(rows, std::max<int64_t>(1, kBlocks / across))));
    amax_kernel<<<grid, kThreads, 0, stream>>>(amax, x, rows, cols, stride);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void quantize_impl(uint8_t* codes, uint8_t* codes_t, const T* x, int64_t rows, int64_t cols,
                   int64_t stride, const float* scale_pair, cpu::Fp8Format format, float* amax,
                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  auto aligned_to = [](const void* p, size_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  const bool by_four = cols % 4 == 0 && stride % 4 == 0 && aligned_to(x, 4 * sizeof(T)) &&
                       aligned_to(codes, 4) &&
                       (codes_t == nullptr || (rows % 4 == 0 && aligned_to(codes_t, 4)));
  if (by_four) {
    const dim3 grid(
        static_cast<unsigned>(detail::ceil_div(cols, kTile4)),
        static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(rows, kTile4), 65535)));
    quantize4_kernel<<<grid, kThreads4, 0, stream>>>(codes, codes_t, x, rows, cols, stride,
                                                     scale_pair, interpretation(format), amax);
  } else {
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(cols, kTile)),
                    static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(rows, kTile), 65535)));
    quantize_kernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(
        codes, codes_t, x, rows, cols, stride, scale_pair, interpretation(format), amax);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

// ---- Blockwise scaling (DeepSeek-V3's tiles in cuBLASLt's block-scaled layouts) ------------

constexpr int kBlock = 128;  // a tile's edge: 1 x 128, 128 x 1 or 128 x 128 elements

__device__ __forceinline__ float tile_scale(float amax, float max_finite, int margin) {
  return device_fp8_scale(amax, max_finite, margin);
}
__device__ __forceinline__ uint8_t code_of(float v, float scale, __nv_fp8_interpretation_t kind) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, kind));
}
__device__ __forceinline__ float warp_bits_max(float m) {
  for (int offset = detail::kWarpSize / 2; offset > 0; offset /= 2)
    m = bits_max(m, __shfl_xor_sync(detail::kFullMask, m, offset));
  return m;
}

// 1 x 128 tiles along each row: a warp per tile (8 a block), each lane 4 elements 32 apart, so
// the warp's loads and byte stores are contiguous. Tile (r, t)'s factor at scales[t * ld + r].
template <typename T>
__global__ void quantize_rows_kernel(uint8_t* codes, float* scales, int64_t scales_ld, const T* x,
                                     int64_t rows, int64_t cols, int64_t stride, float max_finite,
                                     int margin, __nv_fp8_interpretation_t kind, float* amax) {
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize;
  const int64_t row = int64_t{blockIdx.x} * (blockDim.x / detail::kWarpSize) +
                      static_cast<int64_t>(threadIdx.x) / detail::kWarpSize;
  const int64_t tile = blockIdx.y;  // cols / 128 tiles on y (at most 65,535), rows on x
  float v[4], m = 0.0f;
  const bool live = row < rows;  // every thread reaches block_max_into below
  if (live) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = to_f32(x[row * stride + tile * kBlock + lane + 32 * k]);
      m = bits_max(m, fabsf(v[k]));
    }
  }
  m = warp_bits_max(m);
  if (live) {
    const float scale = tile_scale(m, max_finite, margin);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      codes[row * cols + tile * kBlock + lane + 32 * k] = code_of(v[k], scale, kind);
    if (lane == 0) scales[tile * scales_ld + row] = 1.0f / scale;
  }
  if (amax) block_max_into(amax, m);
}

// 128 x 1 tiles down each column, written transposed: codes_t[c * rows + r], the operand whose
// inner dimension is the rows (a weight gradient's tokens). A block takes 128 rows x 32 columns
// through shared memory: loads coalesced along rows, each column's 128 codes stored as 32 words.
// Tile (t, c)'s factor at scales_t[t * ld + c].
constexpr int kColsPerBlock = 32;
template <typename T>
__global__ void quantize_cols_kernel(uint8_t* codes_t, float* scales_t, int64_t scales_ld,
                                     const T* x, int64_t rows, int64_t cols, int64_t stride,
                                     float max_finite, int margin, __nv_fp8_interpretation_t kind,
                                     float* amax) {
  __shared__ float tile[kBlock][kColsPerBlock + 1];
  __shared__ float partial[8][kColsPerBlock];
  __shared__ float scale_of_col[kColsPerBlock];
  const int lane = static_cast<int>(threadIdx.x) % detail::kWarpSize,
            warp = static_cast<int>(threadIdx.x) / detail::kWarpSize;  // 8 warps
  const int64_t r0 = int64_t{blockIdx.y} * kBlock, c0 = int64_t{blockIdx.x} * kColsPerBlock;
  float m = 0.0f;
  // Column c of row r lives at tile[r][(c + r / 32) % 32]: the write phase's reads of rows
  // 4 lane .. 4 lane + 3 of one column then fall in 32 different banks (without the rotation,
  // lanes 8 apart would share one).
  for (int r = warp; r < kBlock; r += 8) {
    const float v = to_f32(x[(r0 + r) * stride + c0 + lane]);
    tile[r][(lane + (r >> 5)) & 31] = v;
    m = bits_max(m, fabsf(v));
  }
  partial[warp][lane] = m;
  __syncthreads();
  float column_amax = 0.0f;
  if (warp == 0) {
    for (int w = 0; w < 8; ++w) column_amax = bits_max(column_amax, partial[w][lane]);
    const float scale = tile_scale(column_amax, max_finite, margin);
    scale_of_col[lane] = scale;
    scales_t[blockIdx.y * scales_ld + c0 + lane] = 1.0f / scale;
  }
  __syncthreads();
  for (int c = warp; c < kColsPerBlock; c += 8) {
    const float scale = scale_of_col[c];
    uint32_t packed = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      packed |= static_cast<uint32_t>(
                    code_of(tile[4 * lane + k][(c + ((4 * lane + k) >> 5)) & 31], scale, kind))
                << (8 * k);
    *reinterpret_cast<uint32_t*>(codes_t + (c0 + c) * rows + r0 + 4 * lane) = packed;
  }
  if (amax) block_max_into(amax, column_amax);  // warp 0 holds the columns' amaxes
}

// 128 x 128 blocks: one scale per block from its amax; codes row-major and, when asked, their
// transpose codes_t[c * rows + r] (the same blocks and scales seen from the other side). Block
// (i, j)'s factor at scales[i * ld + j] and, transposed, scales_t[j * ld_t + i].
constexpr int kPerThread = kBlock * kBlock / kThreads;  // 64 elements a thread
template <typename T>
__global__ void quantize_blocks_kernel(uint8_t* codes, uint8_t* codes_t, float* scales,
                                       int64_t scales_ld, float* scales_t, int64_t scales_t_ld,
                                       const T* x, int64_t rows, int64_t cols, int64_t stride,
                                       float max_finite, int margin, __nv_fp8_interpretation_t kind,
                                       float* amax) {
  __shared__ uint8_t block_codes[kBlock][kBlock + 4];
  __shared__ float warp_max[kThreads / detail::kWarpSize];
  __shared__ float block_scale;
  const int t = static_cast<int>(threadIdx.x);
  const int64_t r0 = int64_t{blockIdx.y} * kBlock, c0 = int64_t{blockIdx.x} * kBlock;
  float v[kPerThread], m = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {  // element i * 256 + t: row (i * 256 + t) / 128
    const int e = i * kThreads + t;
    v[i] = to_f32(x[(r0 + e / kBlock) * stride + c0 + e % kBlock]);
    m = bits_max(m, fabsf(v[i]));
  }
  m = warp_bits_max(m);
  if (t % detail::kWarpSize == 0) warp_max[t / detail::kWarpSize] = m;
  __syncthreads();
  if (t == 0) {
    float b = 0.0f;
    for (int w = 0; w < kThreads / detail::kWarpSize; ++w) b = bits_max(b, warp_max[w]);
    block_scale = tile_scale(b, max_finite, margin);
    if (amax) atomic_max_nonnegative(amax, b);
    scales[blockIdx.y * scales_ld + blockIdx.x] = 1.0f / block_scale;
    if (scales_t) scales_t[blockIdx.x * scales_t_ld + blockIdx.y] = 1.0f / block_scale;
  }
  __syncthreads();
  const float scale = block_scale;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = i * kThreads + t;
    const uint8_t code = code_of(v[i], scale, kind);
    codes[(r0 + e / kBlock) * cols + c0 + e % kBlock] = code;
    if (codes_t) block_codes[e / kBlock][e % kBlock] = code;
  }
  if (codes_t) {  // the same for the whole block, so is the barrier
    __syncthreads();
    for (int i = 0; i < kPerThread; ++i) {  // element i * 256 + t of the transpose
      const int e = i * kThreads + t, c = e / kBlock, r = e % kBlock;
      codes_t[(c0 + c) * rows + r0 + r] = block_codes[r][c];
    }
  }
}

void check_blocks(const char* what, int64_t rows, int64_t cols, int64_t stride) {
  if (rows <= 0 || cols <= 0 || rows % kBlock != 0 || cols % kBlock != 0 || stride < cols)
    throw_error(what, ": a [", rows, ", ", cols, "] block (rows ", stride,
                " apart); blockwise FP8 on CUDA takes rows and columns in multiples of 128");
}

template <typename T>
void quantize_tiles_impl(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                         const T* x, int64_t rows, int64_t cols, int64_t stride,
                         cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  check_blocks("fp8_quantize_tiles", rows, cols, stride);
  if (reinterpret_cast<uintptr_t>(codes_t) % 4 != 0)
    throw_error("fp8_quantize_tiles: transposed codes at an address not 4-byte aligned");
  const float max_finite = cpu::fp8_spec(format).max_finite;
  if (codes) {
    constexpr int kRowsPerBlock = kThreads / detail::kWarpSize;
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(rows, int64_t{kRowsPerBlock})),
                    static_cast<unsigned>(cols / kBlock));
    quantize_rows_kernel<<<grid, kThreads, 0, stream>>>(codes, scales, fp8_vec128_scales_ld(rows),
                                                        x, rows, cols, stride, max_finite, margin,
                                                        interpretation(format), amax);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (codes_t) {
    const dim3 grid(static_cast<unsigned>(cols / kColsPerBlock),
                    static_cast<unsigned>(rows / kBlock));
    quantize_cols_kernel<<<grid, kThreads, 0, stream>>>(
        codes_t, scales_t, fp8_vec128_scales_ld(cols), x, rows, cols, stride, max_finite, margin,
        interpretation(format), amax);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void quantize_blocks_impl(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                          const T* x, int64_t rows, int64_t cols, int64_t stride,
                          cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  check_blocks("fp8_quantize_blocks", rows, cols, stride);
  const dim3 grid(static_cast<unsigned>(cols / kBlock), static_cast<unsigned>(rows / kBlock));
  quantize_blocks_kernel<<<grid, kThreads, 0, stream>>>(
      codes, codes_t, scales, fp8_blk128_scales_ld(cols), scales_t, fp8_blk128_scales_ld(rows), x,
      rows, cols, stride, cpu::fp8_spec(format).max_finite, margin, interpretation(format), amax);
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
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format, float* amax,
                  cudaStream_t stream) {
  quantize_impl(codes, codes_t, x, rows, cols, stride, scale_pair, format, amax, stream);
}
void fp8_quantize(uint8_t* codes, uint8_t* codes_t, const float* x, int64_t rows, int64_t cols,
                  int64_t stride, const float* scale_pair, cpu::Fp8Format format, float* amax,
                  cudaStream_t stream) {
  quantize_impl(codes, codes_t, x, rows, cols, stride, scale_pair, format, amax, stream);
}

int64_t fp8_vec128_scales_ld(int64_t rows) { return (rows + 3) / 4 * 4; }
int64_t fp8_blk128_scales_ld(int64_t cols) { return ((cols + kBlock - 1) / kBlock + 3) / 4 * 4; }

void fp8_quantize_tiles(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                        const bf16* x, int64_t rows, int64_t cols, int64_t stride,
                        cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  quantize_tiles_impl(codes, scales, codes_t, scales_t, x, rows, cols, stride, format, margin, amax,
                      stream);
}
void fp8_quantize_tiles(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                        const float* x, int64_t rows, int64_t cols, int64_t stride,
                        cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  quantize_tiles_impl(codes, scales, codes_t, scales_t, x, rows, cols, stride, format, margin, amax,
                      stream);
}
void fp8_quantize_blocks(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                         const bf16* x, int64_t rows, int64_t cols, int64_t stride,
                         cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  quantize_blocks_impl(codes, scales, codes_t, scales_t, x, rows, cols, stride, format, margin,
                       amax, stream);
}
void fp8_quantize_blocks(uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                         const float* x, int64_t rows, int64_t cols, int64_t stride,
                         cpu::Fp8Format format, int margin, float* amax, cudaStream_t stream) {
  quantize_blocks_impl(codes, scales, codes_t, scales_t, x, rows, cols, stride, format, margin,
                       amax, stream);
}

}  // namespace loom::cuda
