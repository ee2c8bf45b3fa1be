#pragma once
// Pieces shared by the attention forward and backward kernels: tile sizes, the thread layout
// inside a tile, shape checks, tile loads and the shared-memory opt-in.
//
// Thread layout (256 threads, 64 x 64 tiles): thread t works on tile row r = t / 4 and, within
// that row, on every 4th column starting at t % 4: score columns c = t%4 + 4j (16 of them) and
// head dimensions d = t%4 + 4j (head_dim / 4 of them). A row's 4 threads are adjacent lanes of
// one warp, so row reductions are two shuffles. Shared tiles have a row stride of head_dim + 1
// (and 65 for score tiles) so the 8 rows a warp touches at once fall in different banks.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/attention.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"

namespace loom::cuda::detail {

constexpr int kAttnTile = 64;  // query rows and keys per tile
constexpr int kAttnThreads = 256;
constexpr int kAttnThreadsPerRow = kAttnThreads / kAttnTile;        // 4
constexpr int kAttnColsPerThread = kAttnTile / kAttnThreadsPerRow;  // 16
constexpr int kScoreStride = kAttnTile + 1;

// Shape in the form the kernels take it.
struct AttentionDims {
  int batch, seq, heads, kv_heads, head_dim;
  int64_t qkv_ld, out_ld;
  float scale;  // 1 / sqrt(head_dim)
  int tiles;    // query (and key) tiles per sequence
  int group;    // query heads per kv head
};

inline AttentionDims attention_dims(const cpu::AttentionShape& s, int64_t max_head_dim) {
  LOOM_CHECK(s.batch > 0 && s.seq_len > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0,
             "attention shape batch ", s.batch, " seq ", s.seq_len, " heads ", s.heads,
             " kv_heads ", s.kv_heads, " head_dim ", s.head_dim);
  LOOM_CHECK(s.heads % s.kv_heads == 0, "heads ", s.heads, " not a multiple of kv_heads ",
             s.kv_heads);
  if (s.head_dim > max_head_dim)
    throw_error("CUDA attention supports head_dim up to ", max_head_dim, ", got ", s.head_dim);
  LOOM_CHECK(s.batch <= 65535 && s.heads <= 65535 && s.seq_len <= (int64_t{1} << 30),
             "attention grid too large");
  AttentionDims d{};
  d.batch = static_cast<int>(s.batch);
  d.seq = static_cast<int>(s.seq_len);
  d.heads = static_cast<int>(s.heads);
  d.kv_heads = static_cast<int>(s.kv_heads);
  d.head_dim = static_cast<int>(s.head_dim);
  d.qkv_ld = s.qkv_ld();
  d.out_ld = s.out_ld();
  d.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  d.tiles = static_cast<int>(ceil_div(s.seq_len, kAttnTile));
  d.group = d.heads / d.kv_heads;
  return d;
}

// Column offsets of query head h, kv head kvh's key and value in a fused qkv row.
__host__ __device__ inline int64_t q_column(const AttentionDims& d, int h) {
  return int64_t{h} * d.head_dim;
}
__host__ __device__ inline int64_t k_column(const AttentionDims& d, int kvh) {
  return int64_t{d.heads + kvh} * d.head_dim;
}
__host__ __device__ inline int64_t v_column(const AttentionDims& d, int kvh) {
  return int64_t{d.heads + d.kv_heads + kvh} * d.head_dim;
}

// Copies sequence rows [row0, row0 + 64) of a [seq, head_dim] slice (rows at stride ld) into a
// shared tile as f32; rows past the sequence end become zeros.
template <typename T>
__device__ void load_tile(float* tile, const T* src, int64_t ld, int row0, const AttentionDims& d) {
  const int stride = d.head_dim + 1;
  for (int idx = threadIdx.x; idx < kAttnTile * d.head_dim; idx += blockDim.x) {
    const int r = idx / d.head_dim, c = idx % d.head_dim;
    tile[r * stride + c] = row0 + r < d.seq ? to_f32(src[int64_t{row0 + r} * ld + c]) : 0.0f;
  }
}

// Sum / max over the 4 adjacent lanes that share a tile row.
__device__ __forceinline__ float row_quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}
__device__ __forceinline__ float row_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

// Scores and dP of this thread's 16 (row, column) entries: s = q_row . k_col, dp = dO_row . v_col.
__device__ __forceinline__ void scores_and_dp(float* score, float* dp, const float* q_tile,
                                              const float* do_tile, const float* k_tile,
                                              const float* v_tile, int row, int quad,
                                              int head_dim) {
  const int stride = head_dim + 1;
#pragma unroll
  for (int jj = 0; jj < kAttnColsPerThread; ++jj) score[jj] = dp[jj] = 0.0f;
  for (int c = 0; c < head_dim; ++c) {
    const float qc = q_tile[row * stride + c], doc = do_tile[row * stride + c];
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const int col = quad + kAttnThreadsPerRow * jj;
      score[jj] += qc * k_tile[col * stride + c];
      dp[jj] += doc * v_tile[col * stride + c];
    }
  }
}

// Kernels with more than 48 KiB of dynamic shared memory must opt in; this also names the
// limit when a GPU has less than the tiles need.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes) {
  int device = 0, limit = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<size_t>(limit))
    throw_error("CUDA attention needs ", bytes, " bytes of shared memory per block; device ",
                device, " allows ", limit);
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

}  // namespace loom::cuda::detail
