// attention_mma.cu's kernels compiled for the host (see emulated_cuda.hpp).
#include "emulated_cuda.hpp"
//
#include "kernels.hpp"
#include "loom/kernels/cuda/attention_mma.cu"

namespace loom::cuda::detail {
namespace {
alignas(128) unsigned char smem[emulation::kSharedCapacity];
}  // namespace
}  // namespace loom::cuda::detail

namespace emulated {

using namespace loom::cuda::detail;

namespace {
template <int D>
void forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d) {
  emulation::shared_memory = smem;
  emulation::launch(dim3(d.tiles, d.heads, d.batch), dim3(kThreads), tile_bytes<D>(2, 1, 0),
                    [&] { mma_forward_kernel<D>(out, lse, qkv, d); });
}
template <int D>
void backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse, const float* delta,
              const AttentionDims& d) {
  emulation::shared_memory = smem;
  emulation::launch(dim3(d.tiles, d.kv_heads, d.batch), dim3(kThreads), kv_tile_bytes<D>(),
                    [&] { mma_backward_kv_kernel<D>(d_qkv, d_out, qkv, lse, delta, d); });
  emulation::launch(dim3(d.tiles, d.heads, d.batch), dim3(kThreads), tile_bytes<D>(4, 1, 0),
                    [&] { mma_backward_q_kernel<D>(d_qkv, d_out, qkv, lse, delta, d); });
}
}  // namespace

void mma_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d) {
  d.head_dim == 64 ? forward<64>(out, lse, qkv, d) : forward<128>(out, lse, qkv, d);
}
void mma_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                  const float* delta, const AttentionDims& d) {
  d.head_dim == 64 ? backward<64>(d_qkv, d_out, qkv, lse, delta, d)
                   : backward<128>(d_qkv, d_out, qkv, lse, delta, d);
}

}  // namespace emulated
