#pragma once
// Device-side helpers shared by the .cu files (never included by host-only code): element
// loads/stores that widen bf16 to f32 (all arithmetic is f32), warp and block reductions in
// a fixed order (so results do not depend on scheduling), and launch-size arithmetic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace loom::cuda::detail {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
// Round to nearest even, the rounding loom::f32_to_bf16 uses on the host.
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr int kWarpSize = 32;
// std::numeric_limits is host-only without --expt-relaxed-constexpr; the builtin works on both.
constexpr float kNegInfinity = -__builtin_huge_valf();
constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions: every lane ends with the same value, combined in the same order on
// every run.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 values of shared memory.
template <typename V>
__device__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : V(0);
  return warp_sum(v);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid size for a grid-stride loop over n elements: enough blocks to fill a large GPU, never
// more than the work needs.
inline unsigned grid_for(int64_t n, int block_threads) {
  constexpr int64_t kMaxBlocks = 65535;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(ceil_div(n, block_threads), kMaxBlocks)));
}

}  // namespace loom::cuda::detail

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"

namespace loom::cuda::detail {

// Temporary device memory for one kernel sequence on `stream`: a block of the caching
// DeviceAllocator for that stream, counted as Workspace, given back when the buffer dies. The
// block may be handed out again at once, which is safe because it is cached for `stream`
// alone and its next user is queued behind the kernels that use it here (the allocator's
// stream rule). The host never waits, and an exception between allocation and use still
// returns it.
template <typename T>
class ScratchBuffer {
 public:
  ScratchBuffer(int64_t count, cudaStream_t stream)
      : bytes_(count > 0 ? static_cast<size_t>(count) * sizeof(T) : 0) {
    if (bytes_ == 0) return;
    ptr_ = static_cast<T*>(
        DeviceAllocator::current().allocate(bytes_, MemCategory::Workspace, stream));
  }
  ~ScratchBuffer() {
    if (ptr_) DeviceAllocator::current().release(ptr_, bytes_, MemCategory::Workspace);
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t bytes_;
};

}  // namespace loom::cuda::detail
