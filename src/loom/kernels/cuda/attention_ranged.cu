// Attention with a key range per query row (attention.hpp, "attention with a key range per
// query row"): packed documents and the blocks of context parallelism. The causal kernels'
// algorithm and thread layout (attention_common.cuh) with two changes: a key j is visible to
// query row i when begin_i <= j < end_i, and q, k and v come from separate pointers and row
// strides, so the queries may be over another rank's keys (kv_len rows per sequence) and the
// results may be stored wider than the inputs.
//
// A first kernel finds, for each (sequence, query tile), the smallest begin and the largest end
// over its rows that see any key: the forward and dQ kernels walk only the key tiles inside it,
// and the dK/dV kernel skips the query tiles whose bounds miss its key tile. A tile whose rows
// see nothing does no work at all (its outputs are 0 and its lse -inf).
#include <cuda_bf16.h>

#include <climits>

#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_common.cuh"

namespace loom::cuda {

namespace {

using namespace detail;

// The shape in the form the kernels take it.
struct Dims {
  int batch, q_len, kv_len, heads, kv_heads, head_dim, group, q_tiles, kv_tiles;
  float scale;
};

Dims ranged_dims(const RangedAttentionShape& s) {
  LOOM_CHECK(
      s.batch > 0 && s.q_len > 0 && s.kv_len > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0,
      "ranged attention shape batch ", s.batch, " q_len ", s.q_len, " kv_len ", s.kv_len, " heads ",
      s.heads, " kv_heads ", s.kv_heads, " head_dim ", s.head_dim);
  LOOM_CHECK(s.heads % s.kv_heads == 0, "heads ", s.heads, " not a multiple of kv_heads ",
             s.kv_heads);
  if (s.head_dim > kMaxAttentionHeadDim)
    throw_error("CUDA attention supports head_dim up to ", kMaxAttentionHeadDim, ", got ",
                s.head_dim);
  LOOM_CHECK(s.batch <= 65535 && s.heads <= 65535 && s.q_len <= (int64_t{1} << 30) &&
                 s.kv_len <= (int64_t{1} << 30),
             "ranged attention grid too large");
  Dims d{};
  d.batch = static_cast<int>(s.batch);
  d.q_len = static_cast<int>(s.q_len);
  d.kv_len = static_cast<int>(s.kv_len);
  d.heads = static_cast<int>(s.heads);
  d.kv_heads = static_cast<int>(s.kv_heads);
  d.head_dim = static_cast<int>(s.head_dim);
  d.group = d.heads / d.kv_heads;
  d.q_tiles = static_cast<int>(ceil_div(s.q_len, kAttnTile));
  d.kv_tiles = static_cast<int>(ceil_div(s.kv_len, kAttnTile));
  d.scale = 1.0f / sqrtf(static_cast<float>(s.head_dim));
  return d;
}

// Rows [row0, row0 + 64) of a [limit, head_dim] slice (rows at stride ld) into a shared tile as
// f32; rows at or past `limit` become zeros.
template <typename T>
__device__ void load_rows(float* tile, const T* src, int64_t ld, int row0, int limit,
                          int head_dim) {
  const int stride = head_dim + 1;
  for (int idx = threadIdx.x; idx < kAttnTile * head_dim; idx += blockDim.x) {
    const int r = idx / head_dim, c = idx % head_dim;
    tile[r * stride + c] = row0 + r < limit ? to_f32(src[int64_t{row0 + r} * ld + c]) : 0.0f;
  }
}

// bounds[b * q_tiles + qt] = (smallest begin, largest end) over the tile's rows that see a key;
// begin >= end when none does.
__global__ void tile_bounds_kernel(int2* bounds, const int32_t* ranges, Dims d) {
  const int64_t task = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (task >= int64_t{d.batch} * d.q_tiles) return;
  const int b = static_cast<int>(task / d.q_tiles), qt = static_cast<int>(task % d.q_tiles);
  int lo = INT_MAX, hi = 0;
  for (int r = 0; r < kAttnTile; ++r) {
    const int i = qt * kAttnTile + r;
    if (i >= d.q_len) break;
    const int64_t row = int64_t{b} * d.q_len + i;
    const int begin = ranges[2 * row], end = ranges[2 * row + 1];
    if (begin < end) {
      lo = min(lo, begin);
      hi = max(hi, end);
    }
  }
  bounds[task] = make_int2(lo, hi);
}

// The key tiles [first, last] a query tile with these bounds must visit (none when last < first).
__device__ __forceinline__ void key_tiles(int2 bound, int& first, int& last) {
  first = bound.x < bound.y ? bound.x / kAttnTile : 0;
  last = bound.x < bound.y ? (bound.y - 1) / kAttnTile : -1;
}

// One CTA per (query tile, head, sequence): the online softmax over the visible keys.
template <typename TQ, typename TKV, typename TO, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    ranged_forward_kernel(RangedForwardArgs<TQ, TKV, TO> a, const int2* bounds, Dims d) {
  constexpr int kDimsPerThread = kMaxD / kAttnThreadsPerRow;
  extern __shared__ float smem[];
  const int stride = d.head_dim + 1;
  float* q_tile = smem;
  float* k_tile = q_tile + kAttnTile * stride;
  float* v_tile = k_tile + kAttnTile * stride;
  float* p_tile = v_tile + kAttnTile * stride;

  const int qt = static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int i0 = qt * kAttnTile, i = i0 + row;
  const int64_t q_first = int64_t{b} * d.q_len, kv_first = int64_t{b} * d.kv_len;
  const int64_t head_col = int64_t{h} * d.head_dim, kv_col = int64_t{kvh} * d.head_dim;

  load_rows(q_tile, a.q + q_first * a.q_ld + head_col, a.q_ld, i0, d.q_len, d.head_dim);
  const int begin = i < d.q_len ? a.ranges[2 * (q_first + i)] : 0;
  const int end = i < d.q_len ? a.ranges[2 * (q_first + i) + 1] : 0;
  float acc[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) acc[j] = 0.0f;
  float m = kNegInfinity, l = 0.0f;

  int first, last;
  key_tiles(bounds[b * d.q_tiles + qt], first, last);
  for (int kt = first; kt <= last; ++kt) {
    const int j0 = kt * kAttnTile;
    __syncthreads();  // the previous step's K, V and P are no longer read
    load_rows(k_tile, a.k + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
    load_rows(v_tile, a.v + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
    __syncthreads();

    float score[kAttnColsPerThread];
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) score[jj] = 0.0f;
    for (int c = 0; c < d.head_dim; ++c) {
      const float qc = q_tile[row * stride + c];
#pragma unroll
      for (int jj = 0; jj < kAttnColsPerThread; ++jj)
        score[jj] += qc * k_tile[(quad + kAttnThreadsPerRow * jj) * stride + c];
    }
    float tile_max = kNegInfinity;
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const int j = j0 + quad + kAttnThreadsPerRow * jj;
      score[jj] = (j >= begin && j < end) ? score[jj] * d.scale : kNegInfinity;
      tile_max = fmaxf(tile_max, score[jj]);
    }
    tile_max = row_quad_max(tile_max);
    const float new_m = fmaxf(m, tile_max);
    // A row that has seen no key yet keeps m = -inf; measuring from 0 keeps exp(-inf) = 0.
    const float reference = new_m == kNegInfinity ? 0.0f : new_m;
    const float correction = expf(m - reference);
    float row_sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const float p = expf(score[jj] - reference);
      p_tile[row * kScoreStride + quad + kAttnThreadsPerRow * jj] = p;
      row_sum += p;
    }
    l = l * correction + row_quad_sum(row_sum);
    m = new_m;
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) acc[j] *= correction;
    __syncthreads();  // the whole P tile is written

    for (int c = 0; c < kAttnTile; ++c) {
      const float p = p_tile[row * kScoreStride + c];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) {
        const int dim = quad + kAttnThreadsPerRow * j;
        if (dim < d.head_dim) acc[j] += p * v_tile[c * stride + dim];
      }
    }
  }

  if (i < d.q_len) {
    // l > 0 exactly when the row saw a key (its largest score contributes exp(0) = 1).
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    TO* o = a.out + (q_first + i) * a.out_ld + head_col;
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
      const int dim = quad + kAttnThreadsPerRow * j;
      if (dim < d.head_dim) o[dim] = from_f32<TO>(acc[j] * inv);
    }
    if (quad == 0)
      a.lse[(int64_t{b} * d.heads + h) * d.q_len + i] = l > 0.0f ? m + logf(l) : kNegInfinity;
  }
}

// delta[(b H + h) q_len + i] = dO . O over head h of query row i (one warp per entry).
template <typename TQ>
__global__ void ranged_row_dot_kernel(float* delta, const TQ* d_out, const TQ* out, int64_t out_ld,
                                      Dims d) {
  constexpr int kRowsPerBlock = kAttnThreads / kWarpSize;
  const int64_t task = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (task >= int64_t{d.batch} * d.heads * d.q_len) return;
  const int64_t i = task % d.q_len, h = (task / d.q_len) % d.heads,
                b = task / (int64_t{d.q_len} * d.heads);
  const int64_t at = (b * d.q_len + i) * out_ld + h * d.head_dim;
  float sum = 0.0f;
  for (int c = lane; c < d.head_dim; c += kWarpSize)
    sum += to_f32(d_out[at + c]) * to_f32(out[at + c]);
  sum = warp_sum(sum);
  if (lane == 0) delta[task] = sum;
}

// Four operand tiles, the score tile, and per query row its lse, delta, begin and end.
size_t backward_shared_bytes(int head_dim) {
  return (4 * size_t{kAttnTile} * (head_dim + 1) + size_t{kAttnTile} * kScoreStride +
          2 * size_t{kAttnTile}) *
             sizeof(float) +
         2 * size_t{kAttnTile} * sizeof(int);
}
size_t forward_shared_bytes(int head_dim) {
  return (3 * size_t{kAttnTile} * (head_dim + 1) + size_t{kAttnTile} * kScoreStride) *
         sizeof(float);
}

// One CTA per (key tile, kv head, sequence) owns that tile's dK and dV rows: it sums over every
// query head of its group and every query tile whose bounds reach its keys.
template <typename TQ, typename TKV, typename TG, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    ranged_backward_kv_kernel(RangedBackwardArgs<TQ, TKV, TG> a, const float* delta,
                              const int2* bounds, Dims d) {
  constexpr int kDimsPerThread = kMaxD / kAttnThreadsPerRow;
  extern __shared__ float smem[];
  const int stride = d.head_dim + 1;
  float* k_tile = smem;
  float* v_tile = k_tile + kAttnTile * stride;
  float* q_tile = v_tile + kAttnTile * stride;
  float* do_tile = q_tile + kAttnTile * stride;
  float* s_tile = do_tile + kAttnTile * stride;  // P, then dS
  float* lse_rows = s_tile + kAttnTile * kScoreStride;
  float* delta_rows = lse_rows + kAttnTile;
  int* begin_rows = reinterpret_cast<int*>(delta_rows + kAttnTile);
  int* end_rows = begin_rows + kAttnTile;

  const int kt = static_cast<int>(blockIdx.x), kvh = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int j0 = kt * kAttnTile;
  const int64_t q_first = int64_t{b} * d.q_len, kv_first = int64_t{b} * d.kv_len;
  const int64_t kv_col = int64_t{kvh} * d.head_dim;
  load_rows(k_tile, a.k + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
  load_rows(v_tile, a.v + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
  float dk[kDimsPerThread], dv[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) dk[j] = dv[j] = 0.0f;

  for (int qt = 0; qt < d.q_tiles; ++qt) {
    const int2 bound = bounds[b * d.q_tiles + qt];  // the same for the whole block
    if (bound.x >= bound.y || bound.y <= j0 || bound.x >= j0 + kAttnTile) continue;
    const int i0 = qt * kAttnTile;
    for (int h = kvh * d.group; h < (kvh + 1) * d.group; ++h) {
      const int64_t head_col = int64_t{h} * d.head_dim;
      __syncthreads();  // the previous step's Q, dO and score tiles are no longer read
      load_rows(q_tile, a.q + q_first * a.q_ld + head_col, a.q_ld, i0, d.q_len, d.head_dim);
      load_rows(do_tile, a.d_out + q_first * a.out_ld + head_col, a.out_ld, i0, d.q_len,
                d.head_dim);
      if (threadIdx.x < kAttnTile) {
        const int i = i0 + threadIdx.x;
        const bool real = i < d.q_len;
        const int64_t stat = (int64_t{b} * d.heads + h) * d.q_len + i;
        lse_rows[threadIdx.x] = real ? a.lse[stat] : 0.0f;
        delta_rows[threadIdx.x] = real ? delta[stat] : 0.0f;
        begin_rows[threadIdx.x] = real ? a.ranges[2 * (q_first + i)] : 0;
        end_rows[threadIdx.x] = real ? a.ranges[2 * (q_first + i) + 1] : 0;
      }
      __syncthreads();

      float score[kAttnColsPerThread], dp[kAttnColsPerThread];
      scores_and_dp(score, dp, q_tile, do_tile, k_tile, v_tile, row, quad, d.head_dim);
      const int begin = begin_rows[row], end = end_rows[row];
      float ds[kAttnColsPerThread];
#pragma unroll
      for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
        const int col = quad + kAttnThreadsPerRow * jj, j = j0 + col;
        const bool visible = j >= begin && j < end;  // end <= kv_len keeps j in range
        const float p = visible ? expf(score[jj] * d.scale - lse_rows[row]) : 0.0f;
        ds[jj] = visible ? p * (dp[jj] - delta_rows[row]) * d.scale : 0.0f;
        s_tile[row * kScoreStride + col] = p;
      }
      __syncthreads();
      for (int r = 0; r < kAttnTile; ++r) {  // dV[key] += sum over query rows r of P[r][key] dO[r]
        const float p = s_tile[r * kScoreStride + row];
#pragma unroll
        for (int j = 0; j < kDimsPerThread; ++j) {
          const int dim = quad + kAttnThreadsPerRow * j;
          if (dim < d.head_dim) dv[j] += p * do_tile[r * stride + dim];
        }
      }
      __syncthreads();  // P fully read before dS overwrites it
#pragma unroll
      for (int jj = 0; jj < kAttnColsPerThread; ++jj)
        s_tile[row * kScoreStride + quad + kAttnThreadsPerRow * jj] = ds[jj];
      __syncthreads();
      for (int r = 0; r < kAttnTile; ++r) {  // dK[key] += sum over query rows r of dS[r][key] q[r]
        const float g = s_tile[r * kScoreStride + row];
#pragma unroll
        for (int j = 0; j < kDimsPerThread; ++j) {
          const int dim = quad + kAttnThreadsPerRow * j;
          if (dim < d.head_dim) dk[j] += g * q_tile[r * stride + dim];
        }
      }
    }
  }

  const int j = j0 + row;
  if (j < d.kv_len) {
    TG* dk_row = a.d_k + (kv_first + j) * a.d_kv_ld + kv_col;
    TG* dv_row = a.d_v + (kv_first + j) * a.d_kv_ld + kv_col;
#pragma unroll
    for (int jd = 0; jd < kDimsPerThread; ++jd) {
      const int dim = quad + kAttnThreadsPerRow * jd;
      if (dim < d.head_dim) {
        dk_row[dim] = from_f32<TG>(dk[jd]);
        dv_row[dim] = from_f32<TG>(dv[jd]);
      }
    }
  }
}

// One CTA per (query tile, head, sequence) owns that tile's dQ rows of the head.
template <typename TQ, typename TKV, typename TG, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    ranged_backward_q_kernel(RangedBackwardArgs<TQ, TKV, TG> a, const float* delta,
                             const int2* bounds, Dims d) {
  constexpr int kDimsPerThread = kMaxD / kAttnThreadsPerRow;
  extern __shared__ float smem[];
  const int stride = d.head_dim + 1;
  float* q_tile = smem;
  float* do_tile = q_tile + kAttnTile * stride;
  float* k_tile = do_tile + kAttnTile * stride;
  float* v_tile = k_tile + kAttnTile * stride;
  float* s_tile = v_tile + kAttnTile * stride;  // dS

  const int qt = static_cast<int>(blockIdx.x), h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int i0 = qt * kAttnTile, i = i0 + row;
  const int64_t q_first = int64_t{b} * d.q_len, kv_first = int64_t{b} * d.kv_len;
  const int64_t head_col = int64_t{h} * d.head_dim, kv_col = int64_t{kvh} * d.head_dim;
  load_rows(q_tile, a.q + q_first * a.q_ld + head_col, a.q_ld, i0, d.q_len, d.head_dim);
  load_rows(do_tile, a.d_out + q_first * a.out_ld + head_col, a.out_ld, i0, d.q_len, d.head_dim);
  const bool real = i < d.q_len;
  const int64_t stat = (int64_t{b} * d.heads + h) * d.q_len + i;
  const float row_lse = real ? a.lse[stat] : 0.0f;
  const float row_delta = real ? delta[stat] : 0.0f;
  const int begin = real ? a.ranges[2 * (q_first + i)] : 0;
  const int end = real ? a.ranges[2 * (q_first + i) + 1] : 0;
  float dq[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) dq[j] = 0.0f;

  int first, last;
  key_tiles(bounds[b * d.q_tiles + qt], first, last);
  for (int kt = first; kt <= last; ++kt) {
    const int j0 = kt * kAttnTile;
    __syncthreads();  // the previous step's K, V and dS are no longer read
    load_rows(k_tile, a.k + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
    load_rows(v_tile, a.v + kv_first * a.kv_ld + kv_col, a.kv_ld, j0, d.kv_len, d.head_dim);
    __syncthreads();
    float score[kAttnColsPerThread], dp[kAttnColsPerThread];
    scores_and_dp(score, dp, q_tile, do_tile, k_tile, v_tile, row, quad, d.head_dim);
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const int col = quad + kAttnThreadsPerRow * jj, j = j0 + col;
      const bool visible = j >= begin && j < end;
      const float p = visible ? expf(score[jj] * d.scale - row_lse) : 0.0f;
      s_tile[row * kScoreStride + col] = visible ? p * (dp[jj] - row_delta) * d.scale : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < kAttnTile; ++c) {  // dQ[row] += sum over keys c of dS[row][c] k[c]
      const float g = s_tile[row * kScoreStride + c];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) {
        const int dim = quad + kAttnThreadsPerRow * j;
        if (dim < d.head_dim) dq[j] += g * k_tile[c * stride + dim];
      }
    }
  }

  if (real) {
    TG* dst = a.d_q + (q_first + i) * a.d_q_ld + head_col;
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
      const int dim = quad + kAttnThreadsPerRow * j;
      if (dim < d.head_dim) dst[dim] = from_f32<TG>(dq[j]);
    }
  }
}

// The per-tile bounds of a call, in scratch on `stream`.
void compute_bounds(int2* bounds, const int32_t* ranges, const Dims& d, cudaStream_t stream) {
  const int64_t tasks = int64_t{d.batch} * d.q_tiles;
  constexpr int kThreads = 128;
  tile_bounds_kernel<<<static_cast<unsigned>(ceil_div(tasks, kThreads)), kThreads, 0, stream>>>(
      bounds, ranges, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename TQ, typename TKV, typename TO, int kMaxD>
void launch_forward(const RangedForwardArgs<TQ, TKV, TO>& a, const int2* bounds, const Dims& d,
                    cudaStream_t stream) {
  const size_t bytes = forward_shared_bytes(d.head_dim);
  allow_shared_memory(ranged_forward_kernel<TQ, TKV, TO, kMaxD>, bytes);
  const dim3 grid(static_cast<unsigned>(d.q_tiles), static_cast<unsigned>(d.heads),
                  static_cast<unsigned>(d.batch));
  ranged_forward_kernel<TQ, TKV, TO, kMaxD><<<grid, kAttnThreads, bytes, stream>>>(a, bounds, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename TQ, typename TKV, typename TG, int kMaxD>
void launch_backward(const RangedBackwardArgs<TQ, TKV, TG>& a, const float* delta,
                     const int2* bounds, const Dims& d, cudaStream_t stream) {
  const size_t bytes = backward_shared_bytes(d.head_dim);
  allow_shared_memory(ranged_backward_kv_kernel<TQ, TKV, TG, kMaxD>, bytes);
  allow_shared_memory(ranged_backward_q_kernel<TQ, TKV, TG, kMaxD>, bytes);
  ranged_backward_kv_kernel<TQ, TKV, TG, kMaxD>
      <<<dim3(static_cast<unsigned>(d.kv_tiles), static_cast<unsigned>(d.kv_heads),
              static_cast<unsigned>(d.batch)),
         kAttnThreads, bytes, stream>>>(a, delta, bounds, d);
  LOOM_CUDA_CHECK_LAUNCH();
  ranged_backward_q_kernel<TQ, TKV, TG, kMaxD>
      <<<dim3(static_cast<unsigned>(d.q_tiles), static_cast<unsigned>(d.heads),
              static_cast<unsigned>(d.batch)),
         kAttnThreads, bytes, stream>>>(a, delta, bounds, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

// One thread per (sequence, head, row): the CPU merge's arithmetic.
__global__ void merge_partials_kernel(float* out, float* lse, const float* part,
                                      const float* part_lse, int64_t batch, int64_t seq_len,
                                      int64_t heads, int64_t head_dim) {
  const int64_t total = batch * heads * seq_len;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = idx % seq_len, h = (idx / seq_len) % heads, b = idx / (seq_len * heads);
    const float l = lse[idx], p = part_lse[idx], m = fmaxf(l, p);
    if (m == kNegInfinity) continue;  // neither saw a key
    const float w_old = expf(l - m), w_new = expf(p - m), sum = w_old + w_new;
    const float keep = w_old / sum, take = w_new / sum;
    const int64_t at = (b * seq_len + t) * heads * head_dim + h * head_dim;
    for (int64_t k = 0; k < head_dim; ++k) out[at + k] = keep * out[at + k] + take * part[at + k];
    lse[idx] = m + logf(sum);
  }
}

}  // namespace

template <typename TQ, typename TKV, typename TO>
void ranged_attention_forward(const RangedForwardArgs<TQ, TKV, TO>& args,
                              const RangedAttentionShape& shape, cudaStream_t stream) {
  const Dims d = ranged_dims(shape);
  ScratchBuffer<int2> bounds(int64_t{d.batch} * d.q_tiles, stream);
  compute_bounds(bounds.get(), args.ranges, d, stream);
  if (d.head_dim <= 64)
    launch_forward<TQ, TKV, TO, 64>(args, bounds.get(), d, stream);
  else
    launch_forward<TQ, TKV, TO, 128>(args, bounds.get(), d, stream);
}

template <typename TQ, typename TKV, typename TG>
void ranged_attention_backward(const RangedBackwardArgs<TQ, TKV, TG>& args,
                               const RangedAttentionShape& shape, cudaStream_t stream) {
  const Dims d = ranged_dims(shape);
  ScratchBuffer<int2> bounds(int64_t{d.batch} * d.q_tiles, stream);
  compute_bounds(bounds.get(), args.ranges, d, stream);
  const int64_t rows = int64_t{d.batch} * d.heads * d.q_len;
  ScratchBuffer<float> delta(rows, stream);
  constexpr int kRowsPerBlock = kAttnThreads / kWarpSize;
  ranged_row_dot_kernel<<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kAttnThreads, 0,
                          stream>>>(delta.get(), args.d_out, args.out, args.out_ld, d);
  LOOM_CUDA_CHECK_LAUNCH();
  if (d.head_dim <= 64)
    launch_backward<TQ, TKV, TG, 64>(args, delta.get(), bounds.get(), d, stream);
  else
    launch_backward<TQ, TKV, TG, 128>(args, delta.get(), bounds.get(), d, stream);
}

#define LOOM_RANGED_ATTENTION(TQ, TKV, TO)                                                        \
  template void ranged_attention_forward<TQ, TKV, TO>(const RangedForwardArgs<TQ, TKV, TO>&,      \
                                                      const RangedAttentionShape&, cudaStream_t); \
  template void ranged_attention_backward<TQ, TKV, TO>(const RangedBackwardArgs<TQ, TKV, TO>&,    \
                                                       const RangedAttentionShape&, cudaStream_t);
LOOM_RANGED_ATTENTION(float, float, float)
LOOM_RANGED_ATTENTION(bf16, bf16, bf16)
LOOM_RANGED_ATTENTION(bf16, float, float)
LOOM_RANGED_ATTENTION(bf16, float, bf16)
#undef LOOM_RANGED_ATTENTION

void merge_attention_partials(float* out, float* lse, const float* part, const float* part_lse,
                              int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim,
                              cudaStream_t stream) {
  const int64_t total = batch * heads * seq_len;
  if (total <= 0) return;
  constexpr int kThreads = 256;
  merge_partials_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      out, lse, part, part_lse, batch, seq_len, heads, head_dim);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
