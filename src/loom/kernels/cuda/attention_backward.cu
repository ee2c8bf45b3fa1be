// Causal flash attention, backward (FlashAttention-2's algorithm, without atomics):
//   D_i = dO_i . O_i                                  (preprocess, one warp per row)
//   P_ij = exp(scale * q_i . k_j - lse_i)             (recomputed from the saved lse)
//   dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i) scale
//   dV_j = sum_i P_ij dO_i,  dK_j = sum_i dS_ij q_i,  dQ_i = sum_j dS_ij k_j
// One kernel owns a (key tile, kv head) and sums dK, dV over every query head of its group and
// every query tile at or after the diagonal; another owns a (query tile, head) and sums dQ over
// the key tiles up to the diagonal. Every gradient element has exactly one writer.
#include <type_traits>

#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_common.cuh"
#include "loom/kernels/cuda/attention_cudnn.hpp"
#include "loom/kernels/cuda/attention_mma.cuh"

namespace loom::cuda {

namespace {

using namespace detail;

// Four 64 x (head_dim + 1) operand tiles, one 64 x 65 score tile, per-row lse and D.
size_t backward_shared_bytes(int head_dim) {
  return (4 * size_t{kAttnTile} * (head_dim + 1) + size_t{kAttnTile} * kScoreStride +
          2 * size_t{kAttnTile}) *
         sizeof(float);
}

template <typename T>
__global__ void row_dot_kernel(float* delta, const T* d_out, const T* out, AttentionDims d) {
  constexpr int kRowsPerBlock = kAttnThreads / kWarpSize;
  const int64_t task = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (task >= int64_t{d.batch} * d.heads * d.seq) return;
  const int64_t i = task % d.seq, h = (task / d.seq) % d.heads,
                b = task / (int64_t{d.seq} * d.heads);
  const int64_t at = (b * d.seq + i) * d.out_ld + h * d.head_dim;
  float sum = 0.0f;
  for (int c = lane; c < d.head_dim; c += kWarpSize)
    sum += to_f32(d_out[at + c]) * to_f32(out[at + c]);
  sum = warp_sum(sum);
  if (lane == 0) delta[task] = sum;  // task = (b * heads + h) * seq + i, lse's layout
}

template <typename T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_kv_kernel(T* d_qkv, const T* d_out, const T* qkv, const float* lse,
                                 const float* delta, AttentionDims d) {
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

  const int kt = static_cast<int>(blockIdx.x), kvh = blockIdx.y, b = blockIdx.z;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int j0 = kt * kAttnTile;
  const T* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  load_tile(k_tile, base + k_column(d, kvh), d.qkv_ld, j0, d);
  load_tile(v_tile, base + v_column(d, kvh), d.qkv_ld, j0, d);
  // This thread accumulates key row `row` of dK and dV, dimensions quad + 4j.
  float dk[kDimsPerThread], dv[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) dk[j] = dv[j] = 0.0f;

  for (int h = kvh * d.group; h < (kvh + 1) * d.group; ++h) {
    for (int qt = kt; qt < d.tiles; ++qt) {  // causal: only queries i >= j0 see these keys
      const int i0 = qt * kAttnTile;
      __syncthreads();  // the previous step's Q, dO and score tiles are no longer read
      load_tile(q_tile, base + q_column(d, h), d.qkv_ld, i0, d);
      load_tile(do_tile, d_out + int64_t{b} * d.seq * d.out_ld + q_column(d, h), d.out_ld, i0, d);
      if (threadIdx.x < kAttnTile) {
        const int i = i0 + threadIdx.x;
        const int64_t at = (int64_t{b} * d.heads + h) * d.seq + i;
        lse_rows[threadIdx.x] = i < d.seq ? lse[at] : 0.0f;
        delta_rows[threadIdx.x] = i < d.seq ? delta[at] : 0.0f;
      }
      __syncthreads();

      float score[kAttnColsPerThread], dp[kAttnColsPerThread];
      scores_and_dp(score, dp, q_tile, do_tile, k_tile, v_tile, row, quad, d.head_dim);
      const int i = i0 + row;
      float ds[kAttnColsPerThread];
#pragma unroll
      for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
        const int col = quad + kAttnThreadsPerRow * jj, j = j0 + col;
        const bool visible = i < d.seq && j <= i;  // j <= i < seq also keeps j in range
        const float p = visible ? expf(score[jj] * d.scale - lse_rows[row]) : 0.0f;
        ds[jj] = visible ? p * (dp[jj] - delta_rows[row]) * d.scale : 0.0f;
        s_tile[row * kScoreStride + col] = p;
      }
      __syncthreads();
      // dV[key] += sum over query rows r of P[r][key] * dO[r]
      for (int r = 0; r < kAttnTile; ++r) {
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
      // dK[key] += sum over query rows r of dS[r][key] * q[r]
      for (int r = 0; r < kAttnTile; ++r) {
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
  if (j < d.seq) {
    T* dst = d_qkv + (int64_t{b} * d.seq + j) * d.qkv_ld;
#pragma unroll
    for (int jd = 0; jd < kDimsPerThread; ++jd) {
      const int dim = quad + kAttnThreadsPerRow * jd;
      if (dim < d.head_dim) {
        dst[k_column(d, kvh) + dim] = from_f32<T>(dk[jd]);
        dst[v_column(d, kvh) + dim] = from_f32<T>(dv[jd]);
      }
    }
  }
}

template <typename T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_q_kernel(T* d_qkv, const T* d_out, const T* qkv, const float* lse,
                                const float* delta, AttentionDims d) {
  constexpr int kDimsPerThread = kMaxD / kAttnThreadsPerRow;
  extern __shared__ float smem[];
  const int stride = d.head_dim + 1;
  float* q_tile = smem;
  float* do_tile = q_tile + kAttnTile * stride;
  float* k_tile = do_tile + kAttnTile * stride;
  float* v_tile = k_tile + kAttnTile * stride;
  float* s_tile = v_tile + kAttnTile * stride;  // dS

  const int qt = d.tiles - 1 - static_cast<int>(blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int i0 = qt * kAttnTile, i = i0 + row;
  const T* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  load_tile(q_tile, base + q_column(d, h), d.qkv_ld, i0, d);
  load_tile(do_tile, d_out + int64_t{b} * d.seq * d.out_ld + q_column(d, h), d.out_ld, i0, d);
  const int64_t stat = (int64_t{b} * d.heads + h) * d.seq + i;
  const float row_lse = i < d.seq ? lse[stat] : 0.0f;
  const float row_delta = i < d.seq ? delta[stat] : 0.0f;
  float dq[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) dq[j] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int j0 = kt * kAttnTile;
    __syncthreads();  // the previous step's K, V and dS are no longer read
    load_tile(k_tile, base + k_column(d, kvh), d.qkv_ld, j0, d);
    load_tile(v_tile, base + v_column(d, kvh), d.qkv_ld, j0, d);
    __syncthreads();
    float score[kAttnColsPerThread], dp[kAttnColsPerThread];
    scores_and_dp(score, dp, q_tile, do_tile, k_tile, v_tile, row, quad, d.head_dim);
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const int col = quad + kAttnThreadsPerRow * jj, j = j0 + col;
      const bool visible = i < d.seq && j <= i;
      const float p = visible ? expf(score[jj] * d.scale - row_lse) : 0.0f;
      s_tile[row * kScoreStride + col] = visible ? p * (dp[jj] - row_delta) * d.scale : 0.0f;
    }
    __syncthreads();
    // dQ[row] += sum over keys c of dS[row][c] * k[c]
    for (int c = 0; c < kAttnTile; ++c) {
      const float g = s_tile[row * kScoreStride + c];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) {
        const int dim = quad + kAttnThreadsPerRow * j;
        if (dim < d.head_dim) dq[j] += g * k_tile[c * stride + dim];
      }
    }
  }

  if (i < d.seq) {
    T* dst = d_qkv + (int64_t{b} * d.seq + i) * d.qkv_ld + q_column(d, h);
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
      const int dim = quad + kAttnThreadsPerRow * j;
      if (dim < d.head_dim) dst[dim] = from_f32<T>(dq[j]);
    }
  }
}

template <typename T, int kMaxD>
void launch_backward(T* d_qkv, const T* d_out, const T* qkv, const float* lse, const float* delta,
                     const AttentionDims& d, cudaStream_t stream) {
  const size_t bytes = backward_shared_bytes(d.head_dim);
  allow_shared_memory(attention_backward_kv_kernel<T, kMaxD>, bytes);
  allow_shared_memory(attention_backward_q_kernel<T, kMaxD>, bytes);
  const auto tiles = static_cast<unsigned>(d.tiles);
  attention_backward_kv_kernel<T, kMaxD>
      <<<dim3(tiles, static_cast<unsigned>(d.kv_heads), static_cast<unsigned>(d.batch)),
         kAttnThreads, bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
  attention_backward_q_kernel<T, kMaxD>
      <<<dim3(tiles, static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch)), kAttnThreads,
         bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(T* d_qkv, const T* d_out, const T* qkv, const T* out, const float* lse,
                   const AttentionShape& shape, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (use_cudnn(shape, {d_qkv, d_out, qkv, out})) {  // cuDNN computes its own row dots
      cudnn_attention_backward(d_qkv, d_out, qkv, out, lse, shape, stream);
      return;
    }
  }
  const AttentionDims d = attention_dims(shape, kMaxAttentionHeadDim);
  const int64_t rows = int64_t{d.batch} * d.heads * d.seq;
  ScratchBuffer<float> delta(rows, stream);
  constexpr int kRowsPerBlock = kAttnThreads / kWarpSize;
  row_dot_kernel<<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kAttnThreads, 0, stream>>>(
      delta.get(), d_out, out, d);
  LOOM_CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<T, bf16>) {
    if (use_tensor_cores(shape, {d_qkv, d_out, qkv, out})) {
      mma_attention_backward(d_qkv, d_out, qkv, lse, delta.get(), d, stream);
      return;
    }
  }
  if (d.head_dim <= 64)
    launch_backward<T, 64>(d_qkv, d_out, qkv, lse, delta.get(), d, stream);
  else
    launch_backward<T, 128>(d_qkv, d_out, qkv, lse, delta.get(), d, stream);
}

}  // namespace

void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& shape, cudaStream_t stream) {
  backward_impl(d_qkv, d_out, qkv, out, lse, shape, stream);
}
void attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const bf16* out,
                        const float* lse, const AttentionShape& shape, cudaStream_t stream) {
  backward_impl(d_qkv, d_out, qkv, out, lse, shape, stream);
}

}  // namespace loom::cuda
