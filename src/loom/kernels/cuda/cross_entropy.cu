#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/cross_entropy.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/gemm.hpp"

namespace loom::cuda {

namespace {

using detail::from_f32;
using detail::kWarpSize;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;
constexpr int kLossThreads = 1024;
constexpr size_t kRegionAlignBytes = 256;  // cuBLASLt's preferred operand alignment

size_t aligned(size_t bytes) {
  return (bytes + kRegionAlignBytes - 1) / kRegionAlignBytes * kRegionAlignBytes;
}

// Where each piece of scratch lives inside one workspace allocation.
struct Workspace {
  void* logits = nullptr;         // [rows, ld] f32, or bf16 (bf16_logits: also the gradient)
  float* row_max = nullptr;       // [rows] running max of the logits
  float* row_sum = nullptr;       // [rows] running sum of exp(logit - row_max)
  float* target_logit = nullptr;  // [rows]
  float* lse = nullptr;           // [rows]
  double* loss = nullptr;         // [1]
  bf16* d_logits = nullptr;       // [rows, ld]    (bf16 variant with f32 logits)
  float* d_hidden_acc = nullptr;  // [rows, dim]   (bf16 variant)
  size_t bytes = 0;
};

// bf16_logits: the bf16 variant's logits are bf16, and their gradient overwrites them in place.
Workspace layout(char* base, int64_t rows, int64_t dim, int64_t chunk, bool bf16_variant,
                 bool bf16_logits) {
  Workspace w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? base + at : nullptr;
    at += aligned(bytes);
    return p;
  };
  const auto r = static_cast<size_t>(rows);
  const bool half = bf16_variant && bf16_logits;
  w.logits = take(r * static_cast<size_t>(chunk) * (half ? sizeof(bf16) : sizeof(float)));
  w.row_max = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.row_sum = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.target_logit = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.lse = reinterpret_cast<float*>(take(r * sizeof(float)));
  w.loss = reinterpret_cast<double*>(take(sizeof(double)));
  if (bf16_variant) {
    if (!half)
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

// The exponent base for a running max m: m itself, or 0 while m is -inf (nothing but -inf seen
// yet: an empty lane, a row of -inf logits), where every term is then exp(-inf) = 0 instead of
// exp(-inf - -inf) = NaN. A NaN logit still turns the sum NaN (fmaxf skips it, expf does not),
// as it did when the sum went over every logit against one max.
__device__ __forceinline__ float exp_base(float m) { return m == detail::kNegInfinity ? 0.0f : m; }

// Folds N logits into a lane's running max m and sum s of exp(z - m): their max first, then s
// rescaled once to the new max, so N + 1 exponentials for N logits.
template <int N>
__device__ __forceinline__ void absorb(float& m, float& s, const float (&z)[N]) {
  float z_max = z[0];
#pragma unroll
  for (int k = 1; k < N; ++k) z_max = fmaxf(z_max, z[k]);
  const float m_new = fmaxf(m, z_max);
  const float base = exp_base(m_new);
  float add = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) add += expf(z[k] - base);
  s = s * expf(m - base) + add;
  m = m_new;
}

// Four consecutive logits from a 4-element-aligned address: one 16-byte load of f32, one 8-byte
// load of bf16.
__device__ __forceinline__ float4 load_quad(const float* z) {
  return *reinterpret_cast<const float4*>(z);
}
__device__ __forceinline__ float4 load_quad(const bf16* z) {
  const uint2 bits = *reinterpret_cast<const uint2*>(z);
  __nv_bfloat162 lo, hi;
  memcpy(&lo, &bits.x, sizeof lo);
  memcpy(&hi, &bits.y, sizeof hi);
  const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
  return make_float4(a.x, a.y, b.x, b.y);
}

// float4 loads each lane issues before it uses them: 2 KB in flight per warp, enough with
// 32+ warps per SM to keep HBM busy.
constexpr int kLseUnroll = 4;

// Online log-sum-exp over one chunk, one warp per row (16384 rows in a GPT-2 step are plenty of
// warps; a row is 200 KB), in one pass over the logits: each lane keeps its own running max
// and sum of exponentials over the logits it reads, the warp combines them (max first, then
// each lane's sum rescaled to it) and folds the result into the row's running ones, as the CPU
// does chunk by chunk. Lane 0 picks up the target's logit if it is here. The split of a row
// over the lanes and every combination order are fixed: the result does not depend on
// scheduling.
// Loads are 4 logits (16 bytes of f32, 8 of bf16) from the row's first such boundary on, found
// from the row's address: `ld` may be anything (shard_stats_impl's is the shard chunk). The at
// most 3 logits before it and 3 after the last quad are read singly.
template <typename L>
__global__ void chunk_lse_update(float* row_max, float* row_sum, float* target_logit,
                                 const L* logits, int64_t ld, int64_t width, int64_t v0,
                                 const int32_t* targets, int64_t rows) {
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (r >= rows) return;  // the whole warp: the shuffles below see all 32 lanes
  const L* z = logits + r * ld;
  // Every lane starts from the row's running max, so the chunk's max below is the new one.
  const float old_max = row_max[r];
  float m = old_max, s = 0.0f;

  const auto elements_in = static_cast<unsigned>(reinterpret_cast<uintptr_t>(z) / sizeof(L));
  const int64_t to_boundary = (0u - elements_in) % 4u;  // logits to the next quad boundary
  const int64_t head = to_boundary < width ? to_boundary : width;
  const int64_t vecs = (width - head) / 4, tail = head + vecs * 4;
  if (lane < head) {
    const float v[1] = {to_f32(z[lane])};
    absorb(m, s, v);
  }
  if (lane < width - tail) {
    const float v[1] = {to_f32(z[tail + lane])};
    absorb(m, s, v);
  }
  // Lane l reads quads l, l + 32, l + 64, ...: kLseUnroll of them at a time, then the rest
  // one at a time.
  const L* zv = z + head;
  int64_t i = lane;
  for (; i + (kLseUnroll - 1) * kWarpSize < vecs; i += kLseUnroll * kWarpSize) {
    float4 q[kLseUnroll];
#pragma unroll
    for (int u = 0; u < kLseUnroll; ++u) q[u] = load_quad(zv + (i + u * kWarpSize) * 4);
    float v[4 * kLseUnroll];
#pragma unroll
    for (int u = 0; u < kLseUnroll; ++u)
      v[4 * u] = q[u].x, v[4 * u + 1] = q[u].y, v[4 * u + 2] = q[u].z, v[4 * u + 3] = q[u].w;
    absorb(m, s, v);
  }
  for (; i < vecs; i += kWarpSize) {
    const float4 q = load_quad(zv + i * 4);
    const float v[4] = {q.x, q.y, q.z, q.w};
    absorb(m, s, v);
  }

  // The lanes' maxima are all >= old_max, so new_max is the row's new running max.
  const float new_max = detail::warp_max(m);
  const float base = exp_base(new_max);
  const float sum = detail::warp_sum(s * expf(m - base));
  if (lane == 0) {
    row_sum[r] = row_sum[r] * expf(old_max - base) + sum;
    row_max[r] = new_max;
    const int64_t t = targets[r];
    if (t >= v0 && t < v0 + width) target_logit[r] = to_f32(z[t - v0]);
  }
}

// lse per row, each row's loss, and their sum in double: one block, rows split by a fixed
// stride, combined by a fixed-order block reduction.
// With `accumulate` the sum is added into *loss (a running sum over micro-batches).
__global__ void finalize_loss(double* loss, bool accumulate, float* lse, float* row_losses,
                              const float* row_max, const float* row_sum, const float* target_logit,
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
  if (threadIdx.x == 0) *loss = accumulate ? *loss + total : total;
}

// Columns per float4 of logits, "a quad". A thread takes two quads, 32 quads apart: every load
// and store instruction of a warp then covers one contiguous span (512 bytes of f32 logits, 256
// of bf16 gradients), and each thread has 32 bytes of loads in flight.
constexpr int kQuad = 4;

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  // .x = lo sits at the lower address; each rounded as __float2bfloat16_rn (from_f32) does.
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &pair, sizeof bits);
  return bits;
}
// Stores quad q of gradients from `o`, 16-byte (f32) or 8-byte (bf16) aligned. Indexing the
// vector pointer, not the columns: from a column pointer nvcc split the f32 store into three.
__device__ __forceinline__ void store_quad(float* o, int64_t q, float4 g) {
  reinterpret_cast<float4*>(o)[q] = g;
}
__device__ __forceinline__ void store_quad(bf16* o, int64_t q, float4 g) {
  reinterpret_cast<uint2*>(o)[q] = make_uint2(bf16x2_bits(g.x, g.y), bf16x2_bits(g.z, g.w));
}

// d_logits = grad_scale * (softmax - onehot) for one chunk; rows without a target get zeros
// (their logits are not read), and so do the padding columns [width, padded) (see
// padded_last_chunk). `out` may be the f32 logits themselves (in place) or a bf16 copy: every
// column is read and then written by one thread, and by no other, so in place is safe.
// Rows over blockIdx.y, columns over the threads of blockIdx.x (no 64-bit division per
// element: this kernel touches every logit). A row's quads start at element r * ld + head,
// head = -(r * ld) mod 4: a 16-byte boundary of the f32 logits and an 8-byte one of a bf16
// `out` when both buffers are 16-byte aligned (`vectorised`, checked on the host; ld may be
// anything: the shard passes use the shard chunk). The at most 3 columns before head and 3
// after the last quad are written singly; without `vectorised` every column is.
template <typename Out, typename L>
__global__ void softmax_grad(Out* out, const L* logits, int64_t ld, int64_t width, int64_t padded,
                             int64_t v0, const int32_t* targets, const float* lse, float grad_scale,
                             int64_t rows, bool vectorised) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  // Warps take tiles of 64 quads, 2 * stride quads apart; lane l the tile's quads l and l + 32.
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first_quad = (first - lane) * 2 + lane;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t t = targets[r];
    const bool live = t >= 0;
    const float row_lse = live ? lse[r] : 0.0f;
    const int64_t target_col = t - v0;  // outside [0, width) when another chunk holds it
    const L* z = logits + r * ld;
    Out* o = out + r * ld;
    // Column j's gradient from its logit zj (not used outside live columns j < width).
    auto grad = [&](int64_t j, float zj) {
      float g = 0.0f;
      if (live && j < width) {
        g = grad_scale * expf(zj - row_lse);
        if (j == target_col) g -= grad_scale;
      }
      return g;
    };
    auto single = [&](int64_t j) {
      o[j] = from_f32<Out>(grad(j, live && j < width ? to_f32(z[j]) : 0.0f));
    };
    if (!vectorised) {
      for (int64_t j = first; j < padded; j += stride) single(j);
      continue;
    }
    const int64_t to_boundary = -(r * ld) & (kQuad - 1);
    const int64_t head = to_boundary < padded ? to_boundary : padded;
    const int64_t quads = (padded - head) / kQuad, tail = head + quads * kQuad;
    if (first < head) single(first);
    if (first < padded - tail) single(tail + first);
    const L* zq = z + head;
    auto quad_grad = [&](int64_t q, float4 v) {
      const int64_t j = head + q * kQuad;
      return make_float4(grad(j, v.x), grad(j + 1, v.y), grad(j + 2, v.z), grad(j + 3, v.w));
    };
    for (int64_t q = first_quad; q < quads; q += 2 * stride) {
      const int64_t q2 = q + kWarpSize;
      const bool second = q2 < quads;
      // Columns in [width, padded) are inside the row (padded <= ld): loaded, never used.
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v2 = v;
      if (live) {
        v = load_quad(zq + q * kQuad);
        if (second) v2 = load_quad(zq + q2 * kQuad);
      }
      store_quad(o + head, q, quad_grad(q, v));
      if (second) store_quad(o + head, q2, quad_grad(q2, v2));
    }
  }
}

dim3 softmax_grad_grid(int64_t rows, int64_t padded) {
  // A warp per 64-quad tile of the widest row.
  const int64_t tiles = detail::ceil_div(padded, 2 * kQuad * kWarpSize);
  return dim3(
      static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(tiles * kWarpSize, kThreads), 1024)),
      static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// L: the logits' type, f32, or bf16 for the bf16 variant under bf16_logits (the gradient then
// overwrites them in place).
template <typename T, typename L>
double cross_entropy_impl(const CrossEntropyArgsT<T>& a, cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  constexpr bool kHalfLogits = std::is_same_v<L, bf16>;
  static_assert(kBf16 || !kHalfLogits, "bf16 logits belong to the bf16 variant");
  LOOM_CHECK(a.rows > 0 && a.dim > 0 && a.vocab > 0, "cross entropy over rows ", a.rows, " dim ",
             a.dim, " vocab ", a.vocab);
  const int64_t chunk = effective_chunk(a.vocab_chunk, a.vocab);
  const int64_t chunks = detail::ceil_div(a.vocab, chunk);
  const size_t needed =
      layout(nullptr, a.rows, a.dim, padded_to_16(chunk), kBf16, kHalfLogits).bytes;
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
  const Workspace w = layout(base, a.rows, a.dim, ld, kBf16, kHalfLogits);
  L* const logits = static_cast<L*>(w.logits);
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
         a.dim, 0.0f, logits, ld, stream);
  };

  // Pass 1: online log-sum-exp over the chunks.
  init_row_stats<<<detail::grid_for(a.rows, kThreads), kThreads, 0, stream>>>(
      w.row_max, w.row_sum, w.target_logit, a.rows);
  LOOM_CUDA_CHECK_LAUNCH();
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t v0 = c * chunk, width = std::min(chunk, a.vocab - v0);
    logits_of_chunk(v0, width);
    chunk_lse_update<<<row_blocks, kThreads, 0, stream>>>(w.row_max, w.row_sum, w.target_logit,
                                                          logits, ld, width, v0, a.targets, a.rows);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  finalize_loss<<<1, kLossThreads, 0, stream>>>(
      a.loss_sum ? a.loss_sum : w.loss, a.loss_sum != nullptr, w.lse, a.row_losses, w.row_max,
      w.row_sum, w.target_logit, a.targets, a.rows);
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
      if constexpr (std::is_same_v<T, L>)
        d_logits = logits;  // in place
      else
        d_logits = w.d_logits;
      const int64_t padded = padded_of(v0, width);
      softmax_grad<<<softmax_grad_grid(a.rows, padded), kThreads, 0, stream>>>(
          d_logits, logits, ld, width, padded, v0, a.targets, w.lse, a.grad_scale, a.rows,
          aligned_16(d_logits) && aligned_16(logits));
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

  if (a.loss_sum) return 0.0;  // the sum stays on the device; nothing waits
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
        a.rows, aligned_16(d_logits) && aligned_16(a.logits));
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

namespace {
__global__ void rescale_row_sums_kernel(float* row_sum, const float* local_max,
                                        const float* global_max, int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    row_sum[r] *= expf(local_max[r] - global_max[r]);
}
}  // namespace

void rescale_row_sums(float* row_sum, const float* local_max, const float* global_max, int64_t rows,
                      cudaStream_t stream) {
  if (rows <= 0) return;
  rescale_row_sums_kernel<<<detail::grid_for(rows, kThreads), kThreads, 0, stream>>>(
      row_sum, local_max, global_max, rows);
  LOOM_CUDA_CHECK_LAUNCH();
}

void log_sum_exp_loss(double* loss, bool accumulate, float* lse, float* row_losses,
                      const float* row_max, const float* row_sum, const float* target_logit,
                      const int32_t* targets, int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  finalize_loss<<<1, kLossThreads, 0, stream>>>(loss, accumulate, lse, row_losses, row_max, row_sum,
                                                target_logit, targets, rows);
  LOOM_CUDA_CHECK_LAUNCH();
}

namespace {
std::atomic<int> g_bf16_logits{-1};  // -1: not yet read from LOOM_CUDA_LOGITS
}  // namespace

bool bf16_logits() {
  int value = g_bf16_logits.load();
  if (value < 0) {
    const char* text = std::getenv("LOOM_CUDA_LOGITS");
    const std::string mode = text ? text : "";
    if (mode.empty() || mode == "bf16")
      value = 1;
    else if (mode == "f32")
      value = 0;
    else
      throw_error("LOOM_CUDA_LOGITS='", mode, "': expected bf16 or f32");
    g_bf16_logits.store(value);
  }
  return value == 1;
}
void set_bf16_logits(bool on) { g_bf16_logits.store(on ? 1 : 0); }

size_t cross_entropy_workspace_bytes(int64_t rows, int64_t dim, int64_t vocab, int64_t vocab_chunk,
                                     bool bf16_variant) {
  return layout(nullptr, rows, dim, padded_to_16(effective_chunk(vocab_chunk, vocab)), bf16_variant,
                bf16_logits())
      .bytes;
}

double lm_head_cross_entropy(const CrossEntropyArgs& args, cudaStream_t stream) {
  return cross_entropy_impl<float, float>(args, stream);
}
double lm_head_cross_entropy(const CrossEntropyArgsBf16& args, cudaStream_t stream) {
  return bf16_logits() ? cross_entropy_impl<bf16, bf16>(args, stream)
                       : cross_entropy_impl<bf16, float>(args, stream);
}

}  // namespace loom::cuda
