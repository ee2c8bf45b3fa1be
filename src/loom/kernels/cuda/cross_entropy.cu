#include <algorithm>
#include <memory>
#include <type_traits>

#include "loom/kernels/cuda/cross_entropy.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/gemm.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::kWarpSize;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;
constexpr int kLossThreads = 1024;
constexpr size_t kRegionAlignBytes = 256;  // cuBLASLt's preferred operand alignment

size_t aligned(size_t bytes) {
  return (bytes + kRegionAlignBytes - 1) / kRegionAlignBytes * kRegionAlignBytes;
}

// Where each piece of scratch lives inside one workspace allocation.
struct Workspace {
  float* logits = nullptr;        // [rows, ld]
  float* row_max = nullptr;       // [rows] running max of the logits
  float* row_sum = nullptr;       // [rows] running sum of exp(logit - row_max)
  float* target_logit = nullptr;  // [rows]
  float* lse = nullptr;           // [rows]
  double* loss = nullptr;         // [1]
  bf16* d_logits = nullptr;       // [rows, ld]    (bf16 variant)
  float* d_hidden_acc = nullptr;  // [rows, dim]   (bf16 variant)
  size_t bytes = 0;
};

Workspace layout(char* base, int64_t rows, int64_t dim, int64_t chunk, bool bf16_variant) {
  Workspace w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? base + at : nullptr;
    at += aligned(bytes);
    return p;
  };
  const auto r = static_cast<size_t>(rows);
  w.logits = reinterpret_cast<float*>(take(r * static_cast<size_t>(chunk) * sizeof(float)));
  w.row_max = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.row_sum = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.target_logit = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.lse = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.loss = reinterpret_cast<double*>(take(sizeof(double)));
  if (bf16_variant) {
    w.d_logits = reinterpret_cast<bf16*>(take(r * static_cast<size_t>(chunk) * sizeof(bf16)));
    w.d_hidden_acc = reinterpret_cast<float*>(take(r * static_cast<size_t>(dim) * sizeof(float)));
  }
  w.bytes = at;
  return w;
}

int64_t effective_chunk(int64_t vocab_chunk, int64_t vocab) {
  return std::min(std::max<int64_t>(vocab_chunk, 1), vocab);
}
// Vocabulary widths rounded up to 16 columns: the logits buffers' row stride (the chunk's), and
// the width the last chunk's products run on (below). GPT-2's 50257 as a stride leaves every row
// 2-byte aligned, and cuBLASLt then runs its align-1 kernels: on an H100 the three lm-head
// products took 30.6 of the 85 ms of a GPT-2 124M step (batch 16 x 1024).
int64_t padded_to_16(int64_t width) { return (width + 15) / 16 * 16; }

__global__ void init_row_stats(float* row_max, float* row_sum, float* target_logit, int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    row_max[r] = detail::kNegInfinity;
    row_sum[r] = 0.0f;
    target_logit[r] = 0.0f;
  }
}

// Online log-sum-exp over one chunk, one warp per row: fold the chunk's max and
// sum of exponentials into the running ones, and pick up the target's logit if it is here.
__global__ void chunk_lse_update(float* row_max, float* row_sum, float* target_logit,
                                 const float* logits, int64_t ld, int64_t width, int64_t v0,
                                 const int32_t* targets, int64_t rows) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (r >= rows) return;
  const float* z = logits + r * ld;
  float m = row_max[r];
  for (int64_t j = lane; j < width; j += kWarpSize) m = fmaxf(m, z[j]);
  m = detail::warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < width; j += kWarpSize) sum += expf(z[j] - m);
  sum = detail::warp_sum(sum);
  if (lane == 0) {
    row_sum[r] = row_sum[r] * expf(row_max[r] - m) + sum;
    row_max[r] = m;
    const int64_t t = targets[r];
    if (t >= v0 && t < v0 + width) target_logit[r] = z[t - v0];
  }
}

// lse per row, each row's loss, and their sum in double: one block, rows split by a fixed
// stride, combined by a fixed-order block reduction.
__global__ void finalize_loss(double* loss, float* lse, float* row_losses, const float* row_max,
                              const float* row_sum, const float* target_logit,
                              const int32_t* targets, int64_t rows) {
  __shared__ double scratch[kWarpSize];
  double total = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float row_lse = row_max[r] + logf(row_sum[r]);
    lse[r] = row_lse;
    const float row_loss = targets[r] >= 0 ? row_lse - target_logit[r] : 0.0f;
    if (row_losses) row_losses[r] = row_loss;
    total += row_loss;
  }
  total = detail::block_sum(total, scratch);
  if (threadIdx.x == 0) *loss = total;
}

// d_logits = grad_scale * (softmax - onehot) for one chunk; rows without a target get zeros,
// and so do the padding columns [width, padded) (see padded_last_chunk).
// `out` may be the f32 logits themselves (in place) or a bf16 copy.
template <typename Out>
__global__ void softmax_grad(Out* out, const float* logits, int64_t ld, int64_t width,
                             int64_t padded, int64_t v0, const int32_t* targets, const float* lse,
                             float grad_scale, int64_t rows) {
  // Rows over blockIdx.y, columns over the threads of blockIdx.x (no 64-bit division per
  // element: this kernel touches every logit).
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = targets[r];
    const float row_lse = t >= 0 ? lse[r] : 0.0f;
    for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < padded;
         j += int64_t{gridDim.x} * blockDim.x) {
      float g = 0.0f;
      if (t >= 0 && j < width) {
        g = grad_scale * expf(logits[r * ld + j] - row_lse);
        if (t == v0 + j) g -= grad_scale;
      }
      out[r * ld + j] = from_f32<Out>(g);
    }
  }
}

dim3 softmax_grad_grid(int64_t rows, int64_t padded) {
  return dim3(static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(padded, kThreads), 1024)),
              static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

template <typename T>
double cross_entropy_impl(const CrossEntropyArgsT<T>& a, cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  LOOM_CHECK(a.rows > 0 && a.dim > 0 && a.vocab > 0, "cross entropy over rows ", a.rows, " dim ",
             a.dim, " vocab ", a.vocab);
  const int64_t chunk = effective_chunk(a.vocab_chunk, a.vocab);
  const int64_t chunks = detail::ceil_div(a.vocab, chunk);
  const size_t needed = cross_entropy_workspace_bytes(a.rows, a.dim, a.vocab, a.vocab_chunk, kBf16);
  std::unique_ptr<detail::ScratchBuffer<char>> owned;
  char* base = static_cast<char*>(a.workspace);
  if (base) {
    LOOM_CHECK(a.workspace_bytes >= needed, "cross entropy workspace of ", a.workspace_bytes,
               " bytes, needs ", needed);
  } else {
    owned = std::make_unique<detail::ScratchBuffer<char>>(static_cast<int64_t>(needed), stream);
    base = owned->get();
  }
  const int64_t ld = padded_to_16(chunk);
  const Workspace w = layout(base, a.rows, a.dim, ld, kBf16);
  const unsigned row_blocks = static_cast<unsigned>(detail::ceil_div(a.rows, kRowsPerBlock));

  // A last chunk whose width is not a multiple of 16 (GPT-2's 50257) would leave the logits and
  // d_hidden products, where it is cuBLAS's M or K, on cuBLASLt's align-1 kernels (22 of the
  // 80 ms of a GPT-2 124M step on an H100). Its weight rows are copied once per call into a
  // buffer padded with zero rows to 16, and those two products run on `padded` columns: the
  // padding logits are never read, and their gradients are zeros, so the sums are unchanged.
  const int64_t last_v0 = (chunks - 1) * chunk, last_width = a.vocab - last_v0;
  const int64_t last_padded = padded_to_16(last_width);  // <= ld
  std::unique_ptr<detail::ScratchBuffer<T>> padded_last_chunk;
  if (last_padded != last_width) {
    padded_last_chunk = std::make_unique<detail::ScratchBuffer<T>>(last_padded * a.dim, stream);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(padded_last_chunk->get(), a.weight + last_v0 * a.dim,
                                    static_cast<size_t>(last_width * a.dim) * sizeof(T),
                                    cudaMemcpyDeviceToDevice, stream));
    LOOM_CUDA_CHECK(cudaMemsetAsync(
        padded_last_chunk->get() + last_width * a.dim, 0,
        static_cast<size_t>((last_padded - last_width) * a.dim) * sizeof(T), stream));
  }
  auto padded_of = [&](int64_t v0, int64_t width) {
    return padded_last_chunk && v0 == last_v0 ? last_padded : width;
  };
  auto weight_of = [&](int64_t v0) -> const T* {
    return padded_last_chunk && v0 == last_v0 ? padded_last_chunk->get() : a.weight + v0 * a.dim;
  };
  auto logits_of_chunk = [&](int64_t v0, int64_t width) {
    gemm(false, true, a.rows, padded_of(v0, width), a.dim, 1.0f, a.hidden, a.dim, weight_of(v0),
         a.dim, 0.0f, w.logits, ld, stream);
  };

  // Pass 1: online log-sum-exp over the chunks.
  init_row_stats<<<detail::grid_for(a.rows, kThreads), kThreads, 0, stream>>>(
      w.row_max, w.row_sum, w.target_logit, a.rows);
  LOOM_CUDA_CHECK_LAUNCH();
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, a.vocab - v0);
    logits_of_chunk(v0, width);
    chunk_lse_update<<<row_blocks, kThreads, 0, stream>>>(
        w.row_max, w.row_sum, w.target_logit, w.logits, ld, width, v0, a.targets, a.rows);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  finalize_loss<<<1, kLossThreads, 0, stream>>>(w.loss, w.lse, a.row_losses, w.row_max, w.row_sum,
                                                w.target_logit, a.targets, a.rows);
  LOOM_CUDA_CHECK_LAUNCH();

  // Pass 2: per chunk, the logit gradient and the two products.
  if (a.d_hidden || a.d_weight) {
    // f32: d_hidden itself accumulates over chunks; bf16: an f32 buffer does, rounded at the end.
    float* d_hidden_f32 = nullptr;
    if (a.d_hidden) {
      if constexpr (kBf16)
        d_hidden_f32 = w.d_hidden_acc;
      else
        d_hidden_f32 = a.d_hidden;
    }
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t v0 = c * chunk, width = std::min(chunk, a.vocab - v0);
      if (chunks > 1) logits_of_chunk(v0, width);
      T* d_logits;
      if constexpr (kBf16)
        d_logits = w.d_logits;
      else
        d_logits = w.logits;  // in place
      const int64_t padded = padded_of(v0, width);
      softmax_grad<<<softmax_grad_grid(a.rows, padded), kThreads, 0, stream>>>(
          d_logits, w.logits, ld, width, padded, v0, a.targets, w.lse, a.grad_scale, a.rows);
      LOOM_CUDA_CHECK_LAUNCH();
      if (d_hidden_f32)
        gemm(false, false, a.rows, a.dim, padded, 1.0f, d_logits, ld, weight_of(v0), a.dim,
             c == 0 ? 0.0f : 1.0f, d_hidden_f32, a.dim, stream);
      if (a.d_weight)
        gemm(true, false, width, a.dim, a.rows, 1.0f, d_logits, ld, a.hidden, a.dim, 1.0f,
             a.d_weight + v0 * a.dim, a.dim, stream);
    }
    if constexpr (kBf16)
      if (a.d_hidden) convert(a.d_hidden, w.d_hidden_acc, a.rows * a.dim, stream);
  }

  double loss = 0.0;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&loss, w.loss, sizeof loss, cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return loss;
}

template <typename T>
void shard_stats_impl(const ShardLogitsT<T>& a, float* row_max, float* row_sum,
                      float* target_logit, cudaStream_t stream) {
  if (a.rows <= 0) return;
  init_row_stats<<<detail::grid_for(a.rows, kThreads), kThreads, 0, stream>>>(
      row_max, row_sum, target_logit, a.rows);
  LOOM_CUDA_CHECK_LAUNCH();
  const unsigned row_blocks = static_cast<unsigned>(detail::ceil_div(a.rows, kRowsPerBlock));
  for (int64_t v0 = 0; v0 < a.shard; v0 += a.chunk) {
    const int64_t width = std::min(a.chunk, a.shard - v0);
    gemm(false, true, a.rows, width, a.dim, 1.0f, a.hidden, a.dim, a.weight + v0 * a.dim, a.dim,
         0.0f, a.logits, a.chunk, stream);
    // Targets are full-vocabulary ids: this chunk holds ids [vocab_begin + v0, + width).
    chunk_lse_update<<<row_blocks, kThreads, 0, stream>>>(row_max, row_sum, target_logit,
                                                          a.logits, a.chunk, width,
                                                          a.vocab_begin + v0, a.targets, a.rows);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void shard_grad_impl(const ShardLogitsT<T>& a, const float* lse, float grad_scale, T* d_hidden,
                     float* d_weight, cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  if (a.rows <= 0 || (!d_hidden && !d_weight)) return;
  const bool one_chunk = a.chunk >= a.shard;
  std::unique_ptr<detail::ScratchBuffer<bf16>> d_logits_b16;
  std::unique_ptr<detail::ScratchBuffer<float>> d_hidden_acc;
  if constexpr (kBf16) {
    d_logits_b16 = std::make_unique<detail::ScratchBuffer<bf16>>(a.rows * a.chunk, stream);
    if (d_hidden) d_hidden_acc = std::make_unique<detail::ScratchBuffer<float>>(a.rows * a.dim, stream);
  }
  float* d_hidden_f32 = nullptr;
  if (d_hidden) {
    if constexpr (kBf16)
      d_hidden_f32 = d_hidden_acc->get();
    else
      d_hidden_f32 = d_hidden;
  }
  for (int64_t v0 = 0; v0 < a.shard; v0 += a.chunk) {
    const int64_t width = std::min(a.chunk, a.shard - v0);
    if (!one_chunk)
      gemm(false, true, a.rows, width, a.dim, 1.0f, a.hidden, a.dim, a.weight + v0 * a.dim, a.dim,
           0.0f, a.logits, a.chunk, stream);
    T* d_logits;
    if constexpr (kBf16)
      d_logits = d_logits_b16->get();
    else
      d_logits = a.logits;  // in place
    softmax_grad<<<softmax_grad_grid(a.rows, width), kThreads, 0, stream>>>(
        d_logits, a.logits, a.chunk, width, width, a.vocab_begin + v0, a.targets, lse, grad_scale,
        a.rows);
    LOOM_CUDA_CHECK_LAUNCH();
    const T* chunk_weight = a.weight + v0 * a.dim;
    if (d_hidden_f32)
      gemm(false, false, a.rows, a.dim, width, 1.0f, d_logits, a.chunk, chunk_weight, a.dim,
           v0 == 0 ? 0.0f : 1.0f, d_hidden_f32, a.dim, stream);
    if (d_weight)
      gemm(true, false, width, a.dim, a.rows, 1.0f, d_logits, a.chunk, a.hidden, a.dim, 1.0f,
           d_weight + v0 * a.dim, a.dim, stream);
  }
  if constexpr (kBf16)
    if (d_hidden) convert(d_hidden, d_hidden_f32, a.rows * a.dim, stream);
}

}  // namespace

void shard_logit_stats(const ShardLogitsT<float>& args, float* row_max, float* row_sum,
                       float* target_logit, cudaStream_t stream) {
  shard_stats_impl(args, row_max, row_sum, target_logit, stream);
}
void shard_logit_stats(const ShardLogitsT<bf16>& args, float* row_max, float* row_sum,
                       float* target_logit, cudaStream_t stream) {
  shard_stats_impl(args, row_max, row_sum, target_logit, stream);
}
void shard_logit_grad(const ShardLogitsT<float>& args, const float* lse, float grad_scale,
                      float* d_hidden, float* d_weight, cudaStream_t stream) {
  shard_grad_impl(args, lse, grad_scale, d_hidden, d_weight, stream);
}
void shard_logit_grad(const ShardLogitsT<bf16>& args, const float* lse, float grad_scale,
                      bf16* d_hidden, float* d_weight, cudaStream_t stream) {
  shard_grad_impl(args, lse, grad_scale, d_hidden, d_weight, stream);
}

size_t cross_entropy_workspace_bytes(int64_t rows, int64_t dim, int64_t vocab, int64_t vocab_chunk,
                                     bool bf16_variant) {
  return layout(nullptr, rows, dim, padded_to_16(effective_chunk(vocab_chunk, vocab)), bf16_variant)
      .bytes;
}

double lm_head_cross_entropy(const CrossEntropyArgs& args, cudaStream_t stream) {
  return cross_entropy_impl(args, stream);
}
double lm_head_cross_entropy(const CrossEntropyArgsBf16& args, cudaStream_t stream) {
  return cross_entropy_impl(args, stream);
}

}  // namespace loom::cuda
