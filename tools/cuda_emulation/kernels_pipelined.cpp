// attention_pipelined.cu's kernels compiled for the host (see emulated_cuda.hpp), launched with
// the grids and shared-memory sizes of that file's own launchers.
#include "emulated_cuda.hpp"
//
#include "kernels.hpp"
#include "loom/kernels/cuda/attention_pipelined.cu"

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
  constexpr int kM = kForwardMTiles<D>, kRows = kWarps * 16 * kM;
  emulation::shared_memory = smem;
  emulation::launch(dim3((d.seq + kRows - 1) / kRows, d.heads, d.batch), dim3(kThreads),
                    forward_shared_bytes<D, kM>(),
                    [&] { pipelined_forward_kernel<D, kM>(out, lse, qkv, d); });
}
template <int D>
void backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse, const float* delta,
              const AttentionDims& d) {
  constexpr int kQ = kKvQueries<D>;
  emulation::shared_memory = smem;
  emulation::launch(dim3(d.tiles, d.kv_heads, d.batch), dim3(kThreads), kv_shared_bytes<D, kQ>(),
                    [&] { pipelined_backward_kv_kernel<D, kQ>(d_qkv, d_out, qkv, lse, delta, d); });
  emulation::launch(dim3(d.tiles, d.heads, d.batch), dim3(kThreads), q_shared_bytes<D>(),
                    [&] { pipelined_backward_q_kernel<D>(d_qkv, d_out, qkv, lse, delta, d); });
}
}  // namespace

void pipelined_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d) {
  d.head_dim == 64 ? forward<64>(out, lse, qkv, d) : forward<128>(out, lse, qkv, d);
}
void pipelined_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                        const float* delta, const AttentionDims& d) {
  d.head_dim == 64 ? backward<64>(d_qkv, d_out, qkv, lse, delta, d)
                   : backward<128>(d_qkv, d_out, qkv, lse, delta, d);
}

}  // namespace emulated
