// Causal flash attention on tensor cores: the algorithm of the scalar kernels (FlashAttention-2,
// Dao 2023: online softmax forward; backward from the saved lse with one owner per gradient
// element, no atomics) with every product on mma.sync.m16n8k16 (bf16 operands, f32
// accumulators; PTX ISA, "Matrix fragments for mma.m16n8k16").
//
// A CTA is 4 warps over a 64-row tile; warp w owns rows [16w, 16w + 16). In a fragment, lane
// = 4g + t holds rows g and g + 8 and the column pairs (2t, 2t + 1) and (2t + 8, 2t + 9):
// - A (16 x 16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1),
//   a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
// - B (16 x 8, k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
// - C (16 x 8, f32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// Two adjacent C tiles (columns 16s..16s+7 and 16s+8..16s+15) are, element for element, the A
// fragment of columns 16s..16s+15, so probabilities and dS go from one product to the next in
// registers (rounded to bf16 once). Every B operand is read as 32-bit pairs along a shared row:
// tiles whose k runs along the sequence (V in the forward; Q, dO and K in the backward's
// second products) are also stored transposed. Shared rows carry 8 bf16 of padding, so the 8
// rows one fragment load touches fall in 8 distinct groups of 4 banks.
//
// Softmax runs in base 2: s2 = scale * log2(e) * q.k, p = exp2(s2 - m2), and the saved
// lse = ln(2) (m2 + log2 l) is the natural-log statistic the scalar kernels write and read.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "loom/kernels/cuda/attention_cudnn.hpp"
#include "loom/kernels/cuda/attention_fragments.cuh"
#include "loom/kernels/cuda/attention_mma.cuh"
#include "loom/kernels/cuda/device_info.hpp"

namespace loom::cuda {

// The kernel selection and launches are the host's; tools/cuda_emulation compiles only the
// kernels (and launches them itself).
#if !defined(LOOM_CUDA_EMULATION)
namespace {

std::atomic<int> g_kernel{-1};  // -1: not yet read from LOOM_CUDA_ATTENTION

AttentionKernel kernel_from_environment() {
  const char* text = std::getenv("LOOM_CUDA_ATTENTION");
  if (!text || !*text) return AttentionKernel::automatic;
  const std::string value = text;
  if (value == "auto") return AttentionKernel::automatic;
  if (value == "scalar") return AttentionKernel::scalar;
  if (value == "tensor_cores") return AttentionKernel::tensor_cores;
  if (value == "pipelined") return AttentionKernel::pipelined;
  if (value == "cudnn") return AttentionKernel::cudnn;
  throw_error("LOOM_CUDA_ATTENTION='", value,
              "': expected auto, scalar, tensor_cores, pipelined or cudnn");
}

// Compute capability major of each device, read once.
int compute_major(int device) {
  static std::once_flag once;
  static DeviceInfo info;
  std::call_once(once, [] { info = device_info(); });
  if (device < 0 || device >= static_cast<int>(info.devices.size())) return 0;
  return info.devices[static_cast<size_t>(device)].compute_major;
}

}  // namespace

void set_attention_kernel(AttentionKernel kernel) { g_kernel.store(static_cast<int>(kernel)); }

AttentionKernel attention_kernel() {
  int value = g_kernel.load();
  if (value < 0) {
    value = static_cast<int>(kernel_from_environment());
    g_kernel.store(value);
  }
  return static_cast<AttentionKernel>(value);
}

std::string tensor_cores_refusal(const AttentionShape& shape,
                                 std::initializer_list<const void*> pointers) {
  if (shape.head_dim != 64 && shape.head_dim != 128)
    return "head_dim " + std::to_string(shape.head_dim) +
           " (the tensor-core kernels take 64 or 128)";
  for (const void* pointer : pointers)
    if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0)
      return "an operand not 16-byte aligned (the tensor-core kernels load 16-byte rows)";
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  if (compute_major(device) < 8)
    return "device " + std::to_string(device) + " is older than sm_80 (no bf16 mma.sync)";
  return {};
}

#endif  // !LOOM_CUDA_EMULATION

namespace detail {

#if !defined(LOOM_CUDA_EMULATION)
bool use_cudnn(const AttentionShape& shape, std::initializer_list<const void*> pointers) {
  const AttentionKernel kernel = attention_kernel();
  if (kernel != AttentionKernel::cudnn && kernel != AttentionKernel::automatic) return false;
  const std::string refusal = cudnn_attention_refusal(shape, pointers);
  if (kernel == AttentionKernel::automatic) return refusal.empty();  // else loom's own kernels
  if (!refusal.empty())
    throw_error("cuDNN attention (LOOM_CUDA_ATTENTION=cudnn) cannot run: ", refusal);
  return true;
}

bool use_tensor_cores(const AttentionShape& shape, std::initializer_list<const void*> pointers) {
  const AttentionKernel kernel = attention_kernel();
  if (kernel == AttentionKernel::scalar || kernel == AttentionKernel::cudnn) return false;
  const std::string refusal = tensor_cores_refusal(shape, pointers);
  if (refusal.empty()) return true;
  if (kernel == AttentionKernel::tensor_cores || kernel == AttentionKernel::pipelined)
    throw_error("tensor-core attention (LOOM_CUDA_ATTENTION=",
                kernel == AttentionKernel::pipelined ? "pipelined" : "tensor_cores",
                ") cannot take ", refusal);
  return false;
}
#endif  // !LOOM_CUDA_EMULATION

namespace {

constexpr int kTile = kAttnTile;  // 64 query rows and 64 keys: the scalar kernels' tiles
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kWarpRows = kTile / kWarps;  // 16: one mma's M
constexpr int kPad = 8;                    // bf16 of padding per shared row (16 bytes)
constexpr int kTransposedStride = kTile + kPad;

template <int D>
constexpr int kRowStride = D + kPad;
// Bytes of `rows` row-major tiles [64][D + 8] and `transposed` ones [D][64 + 8], then `floats`
// f32 values.
template <int D>
constexpr size_t tile_bytes(int rows, int transposed, int floats) {
  return (size_t(rows) * kTile * kRowStride<D> + size_t(transposed) * D * kTransposedStride) *
             sizeof(bf16) +
         size_t(floats) * sizeof(float);
}

__device__ __forceinline__ uint32_t word(const bf16* tile, int stride, int row, int col) {
  return *reinterpret_cast<const uint32_t*>(tile + row * stride + col);
}

// A fragment of rows [row0, row0 + 16) and columns [col0, col0 + 16) of a row-major tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int stride, int row0,
                                       int col0, int g, int t) {
  a[0] = word(tile, stride, row0 + g, col0 + 2 * t);
  a[1] = word(tile, stride, row0 + g + 8, col0 + 2 * t);
  a[2] = word(tile, stride, row0 + g, col0 + 2 * t + 8);
  a[3] = word(tile, stride, row0 + g + 8, col0 + 2 * t + 8);
}

// B fragment whose column n is tile row n0 + n, with k running along that row from k0.
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf16* tile, int stride,
                                       int n0, int k0, int g, int t) {
  b0 = word(tile, stride, n0 + g, k0 + 2 * t);
  b1 = word(tile, stride, n0 + g, k0 + 2 * t + 8);
}

// Sequence rows [row0, row0 + kRows) of a [seq, D] slice at stride ld into a row-major tile
// [kRows][D + 8] and/or a transposed one [D][kRows + 8] (either may be null), in 16-byte loads;
// rows past the sequence end become zeros.
template <int D, int kRows = kTile>
__device__ void load_rows(bf16* rows, bf16* transposed, const bf16* src, int64_t ld, int row0,
                          int seq) {
  constexpr int kVectors = D / 8;
  for (int idx = threadIdx.x; idx < kRows * kVectors; idx += kThreads) {
    const int r = idx / kVectors, v = idx % kVectors;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row0 + r < seq)
      value = *reinterpret_cast<const uint4*>(src + int64_t{row0 + r} * ld + v * 8);
    if (rows) *reinterpret_cast<uint4*>(rows + r * kRowStride<D> + v * 8) = value;
    if (transposed) {
      const bf16* elements = reinterpret_cast<const bf16*>(&value);
#pragma unroll
      for (int e = 0; e < 8; ++e) transposed[(v * 8 + e) * (kRows + kPad) + r] = elements[e];
    }
  }
}

// Where a warp of a (query tile, head, batch) CTA stands, heaviest (latest) query tiles first:
// the forward's and the dQ kernel's layout. Lane 4g + t; the warp owns rows [w0, w0 + 16).
struct QueryTileWarp {
  int q_tile, h, b, kvh, g, t, w0, i0;
};
__device__ __forceinline__ QueryTileWarp query_tile_warp(const AttentionDims& d) {
  QueryTileWarp c;
  c.q_tile = d.tiles - 1 - static_cast<int>(blockIdx.x);
  c.h = blockIdx.y, c.b = blockIdx.z, c.kvh = c.h / d.group;
  const int lane = threadIdx.x % kWarpSize;
  c.g = lane / 4, c.t = lane % 4, c.w0 = threadIdx.x / kWarpSize * kWarpRows;
  c.i0 = c.q_tile * kTile;
  return c;
}

// The backward's two products over the head dimension for one warp and 32 columns:
// x = A1 B1^T and y = A2 B2^T, with A rows [row0, row0 + 16) and B rows [n0, n0 + 32) of
// row-major [*][D + 8] tiles (scores and dP of 32 queries or keys at once).
template <int D>
__device__ __forceinline__ void paired_products(float (&x)[4][4], float (&y)[4][4],
                                                const bf16* a1_tile, const bf16* a2_tile,
                                                const bf16* b1_tile, const bf16* b2_tile, int row0,
                                                int n0, int g, int t) {
  constexpr int kS = kRowStride<D>;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] = y[nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a1[4], a2[4];
    load_a(a1, a1_tile, kS, row0, kk * 16, g, t);
    load_a(a2, a2_tile, kS, row0, kk * 16, g, t);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      uint32_t b0, b1;
      load_b(b0, b1, b1_tile, kS, n0 + nt * 8, kk * 16, g, t);
      mma(x[nt], a1, b0, b1);
      load_b(b0, b1, b2_tile, kS, n0 + nt * 8, kk * 16, g, t);
      mma(y[nt], a2, b0, b1);
    }
  }
}

// Forward: one CTA per (query tile, head, batch), heaviest (latest) query tiles first.
template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(bf16* out, float* lse, const bf16* qkv, AttentionDims d) {
  constexpr int kS = kRowStride<D>, kDimTiles = D / 8, kDimSlabs = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kTile * kS;
  bf16* vt_s = k_s + kTile * kS;  // V transposed: [D][64 + 8]

  const QueryTileWarp c = query_tile_warp(d);
  const int q_tile = c.q_tile, h = c.h, b = c.b, kvh = c.kvh, g = c.g, t = c.t, w0 = c.w0,
            i0 = c.i0;
  const int row[2] = {i0 + w0 + g, i0 + w0 + g + 8};
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const float scale_log2 = d.scale * kLog2e;

  load_rows<D>(q_s, nullptr, base + q_column(d, h), d.qkv_ld, i0, d.seq);
  __syncthreads();
  uint32_t qf[kDimSlabs][4];
#pragma unroll
  for (int kk = 0; kk < kDimSlabs; ++kk) load_a(qf[kk], q_s, kS, w0, kk * 16, g, t);

  float o[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {kNegInfinity, kNegInfinity}, l[2] = {0.0f, 0.0f};  // l: this lane's part

  for (int kt = 0; kt <= q_tile; ++kt) {
    const int j0 = kt * kTile;
    __syncthreads();  // the previous tile's K and V are no longer read
    load_rows<D>(k_s, nullptr, base + k_column(d, kvh), d.qkv_ld, j0, d.seq);
    load_rows<D>(nullptr, vt_s, base + v_column(d, kvh), d.qkv_ld, j0, d.seq);
    __syncthreads();

    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDimSlabs; ++kk)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b0, b1;
        load_b(b0, b1, k_s, kS, nt * 8, kk * 16, g, t);
        mma(s[nt], qf[kk], b0, b1);
      }

    // Causal mask on the diagonal tile, and keys past the end on the last one.
    const bool masked = kt == q_tile || j0 + kTile > d.seq;
    float tile_max[2] = {kNegInfinity, kNegInfinity};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
        float v = s[nt][e] * scale_log2;
        if (masked && (key > row[r] || key >= d.seq)) v = kNegInfinity;
        s[nt][e] = v;
        tile_max[r] = fmaxf(tile_max[r], v);
      }
    float reference[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float new_m = fmaxf(m[r], row_quad_max(tile_max[r]));
      // A row that has seen no visible key keeps exp2(-inf - 0) = 0 rather than NaN; every
      // row sees key 0 in the first tile, so this is a guard, not a path.
      reference[r] = new_m == kNegInfinity ? 0.0f : new_m;
      const float correction = exp2f(m[r] - reference[r]);
      m[r] = new_m;
      l[r] *= correction;
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        o[dt][2 * r] *= correction;
        o[dt][2 * r + 1] *= correction;
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - reference[e >> 1]);
        s[nt][e] = p;
        l[e >> 1] += p;
      }

#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t pa[4];
      accumulators_to_a(pa, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt) {
        uint32_t b0, b1;
        load_b(b0, b1, vt_s, kTransposedStride, dt * 8, ks * 16, g, t);
        mma(o[dt], pa, b0, b1);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = row_quad_sum(l[r]);
    if (row[r] >= d.seq) continue;
    const float inv = 1.0f / total;
    store_row(out + (int64_t{b} * d.seq + row[r]) * d.out_ld + q_column(d, h), o, r, t, inv);
    if (t == 0) lse[(int64_t{b} * d.heads + h) * d.seq + row[r]] = (m[r] + log2f(total)) * kLn2;
  }
}

// dK and dV: one CTA per (key tile, kv head, batch), summing over every query head of the
// group and every 32-query tile from the diagonal on; warp w owns keys [16w, 16w + 16). Query
// tiles of 32 keep the transposed scores and dP in registers and the shared tiles within the
// 99 KB an sm_86 / sm_89 block may have at head_dim 128 (71 KB; 64-query tiles took 105 KB).
constexpr int kQueryTile = 32;
constexpr int kQueryTransposedStride = kQueryTile + kPad;  // 20 words: conflict-free like 36

template <int D>
constexpr size_t kv_tile_bytes() {
  return (size_t(2) * kTile * kRowStride<D> + size_t(2) * kQueryTile * kRowStride<D> +
          size_t(2) * D * kQueryTransposedStride) *
             sizeof(bf16) +
         size_t(2) * kQueryTile * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_backward_kv_kernel(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                           const float* delta, AttentionDims d) {
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = k_s + kTile * kRowStride<D>;
  bf16* q_s = v_s + kTile * kRowStride<D>;          // [32][D + 8]
  bf16* do_s = q_s + kQueryTile * kRowStride<D>;    // [32][D + 8]
  bf16* qt_s = do_s + kQueryTile * kRowStride<D>;   // Q transposed: [D][32 + 8]
  bf16* dot_s = qt_s + D * kQueryTransposedStride;  // dO transposed: [D][32 + 8]
  float* lse_s = reinterpret_cast<float*>(dot_s + D * kQueryTransposedStride);  // x log2(e)
  float* delta_s = lse_s + kQueryTile;

  const int kt = static_cast<int>(blockIdx.x), kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4, w0 = warp * kWarpRows;
  const int j0 = kt * kTile;
  const int key[2] = {j0 + w0 + g, j0 + w0 + g + 8};
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const bf16* d_out_base = d_out + int64_t{b} * d.seq * d.out_ld;
  const float scale_log2 = d.scale * kLog2e;
  const int query_tiles = (d.seq + kQueryTile - 1) / kQueryTile;

  load_rows<D>(k_s, nullptr, base + k_column(d, kvh), d.qkv_ld, j0, d.seq);
  load_rows<D>(v_s, nullptr, base + v_column(d, kvh), d.qkv_ld, j0, d.seq);

  float dk[kDimTiles][4], dv[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int hh = 0; hh < d.group; ++hh) {
    const int h = kvh * d.group + hh;
    for (int it = j0 / kQueryTile; it < query_tiles; ++it) {
      const int i0 = it * kQueryTile;
      __syncthreads();  // the previous tile's Q, dO and statistics are no longer read
      load_rows<D, kQueryTile>(q_s, qt_s, base + q_column(d, h), d.qkv_ld, i0, d.seq);
      load_rows<D, kQueryTile>(do_s, dot_s, d_out_base + q_column(d, h), d.out_ld, i0, d.seq);
      for (int r = threadIdx.x; r < kQueryTile; r += kThreads) {
        const bool valid = i0 + r < d.seq;
        const int64_t at = (int64_t{b} * d.heads + h) * d.seq + i0 + r;
        lse_s[r] = valid ? lse[at] * kLog2e : 0.0f;
        delta_s[r] = valid ? delta[at] : 0.0f;
      }
      __syncthreads();

      float st[4][4], dpt[4][4];  // S^T = K Q^T and dP^T = V dO^T: rows keys, columns queries
      paired_products<D>(st, dpt, k_s, v_s, q_s, do_s, w0, 0, g, t);
      // P^T and dS^T / scale (the scale is applied to dK once, at the end).
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int local = nt * 8 + 2 * t + (e & 1), query = i0 + local;
          const int r = e >> 1;
          const bool visible = query >= key[r] && query < d.seq && key[r] < d.seq;
          const float p = visible ? exp2f(st[nt][e] * scale_log2 - lse_s[local]) : 0.0f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - delta_s[local]);
        }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t pa[4], dsa[4];
        accumulators_to_a(pa, st[2 * ks], st[2 * ks + 1]);
        accumulators_to_a(dsa, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
        for (int dt = 0; dt < kDimTiles; ++dt) {
          uint32_t b0, b1;
          load_b(b0, b1, dot_s, kQueryTransposedStride, dt * 8, ks * 16, g, t);
          mma(dv[dt], pa, b0, b1);  // dV += P^T dO
          load_b(b0, b1, qt_s, kQueryTransposedStride, dt * 8, ks * 16, g, t);
          mma(dk[dt], dsa, b0, b1);  // dK += dS^T Q
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= d.seq) continue;
    bf16* dst = d_qkv + (int64_t{b} * d.seq + key[r]) * d.qkv_ld;
    store_row(dst + k_column(d, kvh), dk, r, t, d.scale);
    store_row(dst + v_column(d, kvh), dv, r, t, 1.0f);
  }
}

// dQ: one CTA per (query tile, head, batch) over the key tiles up to the diagonal, in halves
// of 32 keys; warp w owns query rows [16w, 16w + 16).
template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_backward_q_kernel(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                          const float* delta, AttentionDims d) {
  constexpr int kS = kRowStride<D>, kDimTiles = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* do_s = q_s + kTile * kS;
  bf16* k_s = do_s + kTile * kS;
  bf16* v_s = k_s + kTile * kS;
  bf16* kt_s = v_s + kTile * kS;  // K transposed

  const QueryTileWarp c = query_tile_warp(d);
  const int q_tile = c.q_tile, h = c.h, b = c.b, kvh = c.kvh, g = c.g, t = c.t, w0 = c.w0,
            i0 = c.i0;
  const int row[2] = {i0 + w0 + g, i0 + w0 + g + 8};
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const float scale_log2 = d.scale * kLog2e;

  load_rows<D>(q_s, nullptr, base + q_column(d, h), d.qkv_ld, i0, d.seq);
  load_rows<D>(do_s, nullptr, d_out + int64_t{b} * d.seq * d.out_ld + q_column(d, h), d.out_ld, i0,
               d.seq);
  float lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = row[r] < d.seq;
    const int64_t at = (int64_t{b} * d.heads + h) * d.seq + row[r];
    lse2[r] = valid ? lse[at] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[at] : 0.0f;
  }

  float dq[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  for (int kt = 0; kt <= q_tile; ++kt) {
    const int j0 = kt * kTile;
    __syncthreads();  // the previous tile's K and V are no longer read
    load_rows<D>(k_s, kt_s, base + k_column(d, kvh), d.qkv_ld, j0, d.seq);
    load_rows<D>(v_s, nullptr, base + v_column(d, kvh), d.qkv_ld, j0, d.seq);
    __syncthreads();

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c0 = half * 32;  // first key of this half within the tile
      float s[4][4], dp[4][4];   // S = Q K^T and dP = dO V^T
      paired_products<D>(s, dp, q_s, do_s, k_s, v_s, w0, c0, g, t);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + c0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
          const bool visible = key <= row[r] && key < d.seq && row[r] < d.seq;
          const float p = visible ? exp2f(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
          s[nt][e] = p * (dp[nt][e] - row_delta[r]);  // dS / scale
        }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t dsa[4];
        accumulators_to_a(dsa, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
        for (int dt = 0; dt < kDimTiles; ++dt) {
          uint32_t b0, b1;
          load_b(b0, b1, kt_s, kTransposedStride, dt * 8, c0 + ks * 16, g, t);
          mma(dq[dt], dsa, b0, b1);  // dQ += dS K
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= d.seq) continue;
    store_row(d_qkv + (int64_t{b} * d.seq + row[r]) * d.qkv_ld + q_column(d, h), dq, r, t, d.scale);
  }
}

#if !defined(LOOM_CUDA_EMULATION)
template <int D>
void forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d, cudaStream_t stream) {
  constexpr size_t bytes = tile_bytes<D>(2, 1, 0);
  allow_shared_memory(mma_forward_kernel<D>, bytes);
  const dim3 grid(static_cast<unsigned>(d.tiles), static_cast<unsigned>(d.heads),
                  static_cast<unsigned>(d.batch));
  mma_forward_kernel<D><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse, const float* delta,
              const AttentionDims& d, cudaStream_t stream) {
  constexpr size_t kv_bytes = kv_tile_bytes<D>(), q_bytes = tile_bytes<D>(4, 1, 0);
  allow_shared_memory(mma_backward_kv_kernel<D>, kv_bytes);
  allow_shared_memory(mma_backward_q_kernel<D>, q_bytes);
  const auto tiles = static_cast<unsigned>(d.tiles);
  mma_backward_kv_kernel<D>
      <<<dim3(tiles, static_cast<unsigned>(d.kv_heads), static_cast<unsigned>(d.batch)), kThreads,
         kv_bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
  mma_backward_q_kernel<D>
      <<<dim3(tiles, static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch)), kThreads,
         q_bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
}
#endif  // !LOOM_CUDA_EMULATION

}  // namespace

#if !defined(LOOM_CUDA_EMULATION)
void mma_attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d,
                           cudaStream_t stream) {
  if (attention_kernel() != AttentionKernel::tensor_cores) {  // pipelined, or automatic
    pipelined_attention_forward(out, lse, qkv, d, stream);
    return;
  }
  if (d.head_dim == 64)
    forward<64>(out, lse, qkv, d, stream);
  else if (d.head_dim == 128)
    forward<128>(out, lse, qkv, d, stream);
  else
    throw_error("tensor-core attention takes head_dim 64 or 128, got ", d.head_dim);
}

void mma_attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                            const float* delta, const AttentionDims& d, cudaStream_t stream) {
  if (attention_kernel() != AttentionKernel::tensor_cores) {  // pipelined, or automatic
    pipelined_attention_backward(d_qkv, d_out, qkv, lse, delta, d, stream);
    return;
  }
  if (d.head_dim == 64)
    backward<64>(d_qkv, d_out, qkv, lse, delta, d, stream);
  else if (d.head_dim == 128)
    backward<128>(d_qkv, d_out, qkv, lse, delta, d, stream);
  else
    throw_error("tensor-core attention takes head_dim 64 or 128, got ", d.head_dim);
}
#endif  // !LOOM_CUDA_EMULATION

}  // namespace detail

}  // namespace loom::cuda
