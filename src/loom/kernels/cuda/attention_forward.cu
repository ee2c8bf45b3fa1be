// Causal flash attention, forward: one CTA per (query tile, head, batch) walks the key tiles
// up to its diagonal with an online softmax (running max m and sum l per row, the output
// accumulator rescaled by exp(m_old - m_new) whenever the max grows), then writes
// out = acc / l and lse = m + log(l).
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_common.cuh"
#include "loom/kernels/cuda/attention_cudnn.hpp"
#include "loom/kernels/cuda/attention_mma.cuh"

namespace loom::cuda {

namespace {

using namespace detail;

// Q, K, V tiles (64 x (head_dim + 1) f32 each) and the 64 x 65 probability tile.
size_t forward_shared_bytes(int head_dim) {
  return (3 * size_t{kAttnTile} * (head_dim + 1) + size_t{kAttnTile} * kScoreStride) *
         sizeof(float);
}

template <typename T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv, AttentionDims d) {
  constexpr int kDimsPerThread = kMaxD / kAttnThreadsPerRow;
  constexpr float kNegInf = kNegInfinity;
  extern __shared__ float smem[];
  const int stride = d.head_dim + 1;
  float* q_tile = smem;
  float* k_tile = q_tile + kAttnTile * stride;
  float* v_tile = k_tile + kAttnTile * stride;
  float* p_tile = v_tile + kAttnTile * stride;

  // Later query tiles see more keys; the scheduler starts the heaviest CTAs first.
  const int q_tile_index = d.tiles - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int row = threadIdx.x / kAttnThreadsPerRow, quad = threadIdx.x % kAttnThreadsPerRow;
  const int i0 = q_tile_index * kAttnTile, i = i0 + row;
  const T* base = qkv + int64_t{b} * d.seq * d.qkv_ld;

  load_tile(q_tile, base + q_column(d, h), d.qkv_ld, i0, d);
  float acc[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) acc[j] = 0.0f;
  float m = kNegInf, l = 0.0f;

  for (int kt = 0; kt <= q_tile_index; ++kt) {
    const int j0 = kt * kAttnTile;
    __syncthreads();  // the previous step's K, V and P are no longer read
    load_tile(k_tile, base + k_column(d, kvh), d.qkv_ld, j0, d);
    load_tile(v_tile, base + v_column(d, kvh), d.qkv_ld, j0, d);
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
    float tile_max = kNegInf;
#pragma unroll
    for (int jj = 0; jj < kAttnColsPerThread; ++jj) {
      const int j = j0 + quad + kAttnThreadsPerRow * jj;
      score[jj] = (j <= i && j < d.seq) ? score[jj] * d.scale : kNegInf;  // causal: j <= i
      tile_max = fmaxf(tile_max, score[jj]);
    }
    tile_max = row_quad_max(tile_max);
    const float new_m = fmaxf(m, tile_max);
    // While a row has seen no visible key its max is -inf; measuring from 0 then keeps
    // exp(-inf - reference) = 0 instead of NaN. (With aligned 64 x 64 tiles every row sees
    // key 0 in the first tile, so this is a guard, not a path the shapes take.)
    const float reference = new_m == kNegInf ? 0.0f : new_m;
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

  if (i < d.seq) {
    const float inv = 1.0f / l;
    T* o = out + (int64_t{b} * d.seq + i) * d.out_ld + q_column(d, h);
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
      const int dim = quad + kAttnThreadsPerRow * j;
      if (dim < d.head_dim) o[dim] = from_f32<T>(acc[j] * inv);
    }
    if (quad == 0) lse[(int64_t{b} * d.heads + h) * d.seq + i] = m + logf(l);
  }
}

template <typename T, int kMaxD>
void launch_forward(T* out, float* lse, const T* qkv, const AttentionDims& d, cudaStream_t stream) {
  const size_t bytes = forward_shared_bytes(d.head_dim);
  allow_shared_memory(attention_forward_kernel<T, kMaxD>, bytes);
  const dim3 grid(static_cast<unsigned>(d.tiles), static_cast<unsigned>(d.heads),
                  static_cast<unsigned>(d.batch));
  attention_forward_kernel<T, kMaxD><<<grid, kAttnThreads, bytes, stream>>>(out, lse, qkv, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void forward_impl(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                  cudaStream_t stream) {
  const AttentionDims d = attention_dims(shape, kMaxAttentionHeadDim);
  // Register arrays are sized at compile time: small heads get the 64-wide instantiation.
  if (d.head_dim <= 64)
    launch_forward<T, 64>(out, lse, qkv, d, stream);
  else
    launch_forward<T, 128>(out, lse, qkv, d, stream);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape,
                       cudaStream_t stream) {
  forward_impl(out, lse, qkv, shape, stream);
}
void attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionShape& shape,
                       cudaStream_t stream) {
  if (detail::use_cudnn(shape, {out, qkv})) {
    detail::cudnn_attention_forward(out, lse, qkv, shape, stream);
    return;
  }
  if (detail::use_tensor_cores(shape, {out, qkv})) {
    detail::mma_attention_forward(out, lse, qkv, attention_dims(shape, kMaxAttentionHeadDim),
                                  stream);
    return;
  }
  forward_impl(out, lse, qkv, shape, stream);
}

}  // namespace loom::cuda
