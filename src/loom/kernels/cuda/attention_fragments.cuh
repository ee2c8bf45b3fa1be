#pragma once
// Warp-level pieces of the tensor-core attention kernels (attention_mma.cu and
// attention_pipelined.cu): the bf16 mma.sync.m16n8k16 with f32 accumulators, the packing of
// accumulators into the next product's A fragment, and, for the pipelined kernels, ldmatrix
// fragment loads and cp.async copies (PTX ISA: "Matrix fragments for mma.m16n8k16",
// "ldmatrix", "cp.async").
//
// In a fragment, lane = 4g + t holds rows g and g + 8 and the column pairs (2t, 2t + 1) and
// (2t + 8, 2t + 9):
// - A (16 x 16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1),
//   a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9)
// - B (16 x 8, k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
// - C (16 x 8, f32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// Devices before sm_80 never reach these (tensor_cores_refusal keeps them off); there the
// instructions trap. Under LOOM_CUDA_EMULATION (tools/cuda_emulation: the kernels compiled for
// the host, a thread per lane) the warp-wide instructions call that emulation instead.
#include <cuda_bf16.h>

#include <cstdint>

#if defined(LOOM_CUDA_EMULATION)
#include "emulated_cuda.hpp"
#endif

namespace loom::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c (16 x 8, f32) += a (16 x 16, bf16) b (16 x 8, bf16).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(LOOM_CUDA_EMULATION)
  emulation::mma(c, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// The A fragment of columns [16s, 16s + 16) from the C tiles of columns [16s, 16s + 8) (lo) and
// [16s + 8, 16s + 16) (hi), rounded to bf16: two adjacent C tiles are, element for element, one
// A fragment, so probabilities and dS go from one product to the next in registers.
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(dst) = pack_bf16(lo, hi);
}

// Row g + 8 r of a warp's 16-row accumulator tiles acc[dt] (columns 8 dt .. 8 dt + 7), times
// `scale`, as bf16 pairs from dst (the row's first column): the epilogue of every kernel.
template <int kDimTiles>
__device__ __forceinline__ void store_row(__nv_bfloat16* dst, const float (&acc)[kDimTiles][4],
                                          int r, int t, float scale) {
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt)
    store_pair(dst + dt * 8 + 2 * t, acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix .x4: lanes 8i..8i+7 give the 8 row addresses (16 bytes each) of matrix i, and
// register i of lane 4g + t receives row g, columns 2t..2t+1 of matrix i (with .trans: row 2t
// and 2t + 1 of column g, i.e. the matrix transposed).
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const __nv_bfloat16* p) {
#if defined(LOOM_CUDA_EMULATION)
  emulation::load_matrices(r, p, false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
#else
  __trap();
#endif
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const __nv_bfloat16* p) {
#if defined(LOOM_CUDA_EMULATION)
  emulation::load_matrices(r, p, true);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
#else
  __trap();
#endif
}

// The A fragment of rows [row0, row0 + 16) and columns [col0, col0 + 16) of a row-major tile:
// matrices (rows, columns) +(0, 0), +(8, 0), +(0, 8), +(8, 8) are a0..a3.
__device__ __forceinline__ void fragment_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int stride,
                                           int row0, int col0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  load_matrices(a, tile + (row0 + r + (i & 1) * 8) * stride + col0 + (i >> 1) * 8);
}

// B fragments of two n8 tiles whose column n is tile row n0 + n (n in [0, 16)), with k running
// along the row from k0 (K in Q K^T): b[0], b[1] for n0..n0+7, b[2], b[3] for n0+8..n0+15.
// Matrices +(0, 0), +(0, 8), +(8, 0), +(8, 8).
__device__ __forceinline__ void fragments_b_along_rows(uint32_t (&b)[4], const __nv_bfloat16* tile,
                                                       int stride, int n0, int k0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  load_matrices(b, tile + (n0 + r + (i >> 1) * 8) * stride + k0 + (i & 1) * 8);
}

// B fragments of two n8 tiles whose k runs down tile rows [k0, k0 + 16) and whose column n is
// tile column n0 + n (V in P V): the same registers as above, read transposed from matrices
// +(0, 0), +(8, 0), +(0, 8), +(8, 8).
__device__ __forceinline__ void fragments_b_down_rows(uint32_t (&b)[4], const __nv_bfloat16* tile,
                                                      int stride, int k0, int n0, int lane) {
  const int i = lane >> 3, r = lane & 7;
  load_matrices_transposed(b, tile + (k0 + r + (i & 1) * 8) * stride + n0 + (i >> 1) * 8);
}

// Asynchronous global -> shared copies (cp.async; sm_80+). With `valid` false nothing is read
// and the destination is zero-filled; `src` must still be a mapped address.
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) {
#if defined(LOOM_CUDA_EMULATION)
  emulation::copy_async(dst, src, 16, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void copy_async_4(void* dst, const void* src, bool valid) {
#if defined(LOOM_CUDA_EMULATION)
  emulation::copy_async(dst, src, 4, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 4 : 0)
               : "memory");
#else
  __trap();
#endif
}
// Closes the group of copies this thread has issued since the last commit (possibly none).
__device__ __forceinline__ void commit_copies() {
#if defined(LOOM_CUDA_EMULATION)
  emulation::commit_copies();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most `kPending` of this thread's most recent groups are still in flight
// (groups complete in order). Other threads' copies need a __syncthreads() after it.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
#if defined(LOOM_CUDA_EMULATION)
  emulation::wait_copies(kPending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace loom::cuda::detail
