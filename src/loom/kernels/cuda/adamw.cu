#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/adamw.hpp"
#include "loom/kernels/cuda/device_common.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Per-step scalars, computed on the host in double exactly as the CPU kernel does.
struct AdamWScalars {
  float beta1, beta2, eps, grad_multiplier;
  float bias_correction2_sqrt, step_size, decay;
};

AdamWScalars scalars_of(const AdamWStep& step) {
  const double t = static_cast<double>(step.step);
  AdamWScalars s{};
  s.beta1 = step.beta1;
  s.beta2 = step.beta2;
  s.eps = step.eps;
  s.grad_multiplier = step.grad_multiplier;
  const auto bias_correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(step.beta1), t));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(step.beta2), t)));
  s.step_size = step.lr / bias_correction1;
  s.decay = 1.0f - step.lr * step.weight_decay;
  return s;
}

// One element: p, m and v in, updated. Both kernels call this one expression so that they
// round alike. The compiler contracts the m and v lines into FMAs itself (fma.rn in the PTX,
// fixed from then on); the last line's p * decay - q it would leave to ptxas as a plain
// multiply and subtract, free to be fused in one kernel and not in another, so the FMA is
// spelled out. (ptxas normally fuses such a single-use pair, so the per-tensor kernel's bits
// should be those it had before.)
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float grad,
                                              const AdamWScalars& s) {
  const float g = grad * s.grad_multiplier;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  p = __fmaf_rn(p, s.decay, -(s.step_size * m / denom));
}

__global__ void adamw_kernel(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                             float* exp_avg_sq, int64_t n, AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(p, m, v, grad[i], s);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
    if (param_bf16) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

void adamw_impl(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, const AdamWStep& step, cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(
      param, param_bf16, grad, exp_avg, exp_avg_sq, n, scalars_of(step));
  LOOM_CUDA_CHECK_LAUNCH();
}

// The multi-tensor step: every tensor cut into tiles of kTile elements, a block per tile (in
// turns when there are more tiles than blocks), so a 38M-element embedding and a 768-element
// bias share one launch without either leaving the GPU idle. A thread takes kGroups 16-byte
// groups of each array per tile, one after the other: loading all of them before the first
// store (a store may alias the next load as far as the compiler knows) took over 200 registers,
// while one group at a time takes 45 (sm_90), and the 1280 threads per SM that allows keep
// 80 KiB of loads in flight anyway. The tile is kGroups groups wide so that the search for a
// tile's tensor is paid once per 4096 elements.
constexpr int kVec = 4;  // floats per 16-byte access
constexpr int kGroups = 4;
constexpr int64_t kTile = int64_t{kThreads} * kVec * kGroups;
constexpr int64_t kMaxBlocks = 65535;

// One tensor, as the kernel reads it from the device table (the host fills it).
struct AdamWSlice {
  float* param;
  bf16* param_bf16;  // null: no bf16 copy
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;           // > 0
  int64_t first_tile;  // its tiles are [first_tile, first_tile + ceil(n / kTile))
  AdamWScalars s;
  bool vectorized;  // the f32 pointers 16-byte aligned, the bf16 one 8-byte
};

__device__ __forceinline__ unsigned bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ void adamw_one(const AdamWSlice& t, const AdamWScalars& s, int64_t i) {
  float p = t.param[i], m = t.exp_avg[i], v = t.exp_avg_sq[i];
  adamw_element(p, m, v, t.grad[i], s);
  t.exp_avg[i] = m;
  t.exp_avg_sq[i] = v;
  t.param[i] = p;
  if (t.param_bf16) t.param_bf16[i] = __float2bfloat16_rn(p);
}

__global__ void adamw_multi_kernel(const AdamWSlice* slices, int64_t count, int64_t tiles) {
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // The tensor holding this tile: the last one whose first tile is at or before it (every
    // tensor has at least one tile, so that one's tiles contain it).
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (slices[mid].first_tile <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
    const AdamWSlice t = slices[lo];
    const AdamWScalars s = t.s;
    const int64_t begin = (tile - t.first_tile) * kTile, end = min(t.n, begin + kTile);
    if (t.vectorized) {
      // Group u of this thread starts at begin + (u * kThreads + threadIdx.x) * kVec: each
      // warp access is 512 contiguous bytes. begin is a multiple of kVec, so only the tensor's
      // last n % kVec elements fall outside whole groups; the thread whose group would hold
      // them does them one by one.
#pragma unroll 1
      for (int u = 0; u < kGroups; ++u) {
        const int64_t i = begin + (int64_t{u} * kThreads + threadIdx.x) * kVec;
        if (i + kVec <= end) {
          float4 p = *reinterpret_cast<const float4*>(t.param + i);
          const float4 g = *reinterpret_cast<const float4*>(t.grad + i);
          float4 m = *reinterpret_cast<const float4*>(t.exp_avg + i);
          float4 v = *reinterpret_cast<const float4*>(t.exp_avg_sq + i);
          adamw_element(p.x, m.x, v.x, g.x, s);
          adamw_element(p.y, m.y, v.y, g.y, s);
          adamw_element(p.z, m.z, v.z, g.z, s);
          adamw_element(p.w, m.w, v.w, g.w, s);
          *reinterpret_cast<float4*>(t.exp_avg + i) = m;
          *reinterpret_cast<float4*>(t.exp_avg_sq + i) = v;
          *reinterpret_cast<float4*>(t.param + i) = p;
          if (t.param_bf16) {
            // Element i in the low half: little-endian, as four bf16 stores would lay them.
            const uint2 packed{bf16_bits(p.x) | (bf16_bits(p.y) << 16),
                               bf16_bits(p.z) | (bf16_bits(p.w) << 16)};
            *reinterpret_cast<uint2*>(t.param_bf16 + i) = packed;
          }
        } else {
          for (int64_t j = i; j < end; ++j) adamw_one(t, s, j);
        }
      }
    } else {
      // Unaligned pointers (a slice at an odd offset): element by element, coalesced.
#pragma unroll 1
      for (int u = 0; u < kVec * kGroups; ++u) {
        const int64_t i = begin + int64_t{u} * kThreads + threadIdx.x;
        if (i < end) adamw_one(t, s, i);
      }
    }
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step, cudaStream_t stream) {
  adamw_impl(param, nullptr, grad, exp_avg, exp_avg_sq, n, step, stream);
}
void adamw_update(float* param, bf16* param_bf16, const float* grad, float* exp_avg,
                  float* exp_avg_sq, int64_t n, const AdamWStep& step, cudaStream_t stream) {
  adamw_impl(param, param_bf16, grad, exp_avg, exp_avg_sq, n, step, stream);
}

void adamw_update_many(const AdamWTensor* tensors, int64_t count, cudaStream_t stream) {
  std::vector<AdamWSlice> host;
  host.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
  int64_t tiles = 0;
  for (int64_t k = 0; k < count; ++k) {
    const AdamWTensor& x = tensors[k];
    if (x.n <= 0) continue;  // no tiles: the kernel's search needs every tensor to own one
    AdamWSlice t{};
    t.param = x.param;
    t.param_bf16 = x.param_bf16;
    t.grad = x.grad;
    t.exp_avg = x.exp_avg;
    t.exp_avg_sq = x.exp_avg_sq;
    t.n = x.n;
    t.first_tile = tiles;
    t.s = scalars_of(x.step);
    t.vectorized = aligned(x.param, 16) && aligned(x.grad, 16) && aligned(x.exp_avg, 16) &&
                   aligned(x.exp_avg_sq, 16) && aligned(x.param_bf16, 8);
    host.push_back(t);
    tiles += detail::ceil_div(x.n, kTile);
  }
  if (host.empty()) return;
  // The table goes up with the work (a launch's arguments cannot hold hundreds of tensors):
  // from pageable memory the copy returns once the table is staged, so the host never waits.
  const auto size = static_cast<int64_t>(host.size());
  detail::ScratchBuffer<AdamWSlice> table(size, stream);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(table.get(), host.data(),
                                  static_cast<size_t>(size) * sizeof(AdamWSlice),
                                  cudaMemcpyHostToDevice, stream));
  const auto blocks = static_cast<unsigned>(std::min(tiles, kMaxBlocks));
  adamw_multi_kernel<<<blocks, kThreads, 0, stream>>>(table.get(), size, tiles);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
