// The mixture-of-experts ops on CUDA (ops_cuda.hpp): positions uploaded, rows in the
// activations' dtype, the router's weights in f32.
#include "loom/kernels/cuda/moe.hpp"
#include "loom/kernels/cuda/ops_cuda.hpp"
#include "loom/kernels/cuda/ops_cuda_common.cuh"

namespace loom::ops::cuda_impl {

void moe_gather(const Tensor& routed, const Tensor& x, std::span<const int32_t> position,
                int64_t k) {
  const DeviceIds p(position.data(), static_cast<int64_t>(position.size()));
  const int64_t rows = x.size(0), c = x.size(1);
  if (is_bf16("moe_gather", {&routed, &x}))
    cuda::moe_gather(b16(routed), b16(x), p.get(), rows, k, c);
  else
    cuda::moe_gather(f32(routed), f32(x), p.get(), rows, k, c);
}

void moe_gather_backward(const Tensor& d_x, const Tensor& d_routed,
                         std::span<const int32_t> position, int64_t k) {
  const DeviceIds p(position.data(), static_cast<int64_t>(position.size()));
  const int64_t rows = d_x.size(0), c = d_x.size(1);
  if (is_bf16("moe_gather_backward", {&d_x, &d_routed}))
    cuda::moe_gather_backward(b16(d_x), b16(d_routed), p.get(), rows, k, c);
  else
    cuda::moe_gather_backward(f32(d_x), f32(d_routed), p.get(), rows, k, c);
}

void moe_combine(const Tensor& out, const Tensor& expert_out, const Tensor& weights,
                 std::span<const int32_t> position, int64_t k) {
  const DeviceIds p(position.data(), static_cast<int64_t>(position.size()));
  const int64_t rows = out.size(0), c = out.size(1);
  if (is_bf16("moe_combine", {&out, &expert_out}))
    cuda::moe_combine(b16(out), b16(expert_out), f32(weights), p.get(), rows, k, c);
  else
    cuda::moe_combine(f32(out), f32(expert_out), f32(weights), p.get(), rows, k, c);
}

void moe_combine_backward(const Tensor& d_expert_out, const Tensor& d_weights, const Tensor& d_out,
                          const Tensor& expert_out, const Tensor& weights,
                          std::span<const int32_t> position, int64_t k) {
  const DeviceIds p(position.data(), static_cast<int64_t>(position.size()));
  const int64_t rows = d_out.size(0), c = d_out.size(1);
  if (is_bf16("moe_combine_backward", {&d_expert_out, &d_out, &expert_out}))
    cuda::moe_combine_backward(b16(d_expert_out), f32(d_weights), b16(d_out), b16(expert_out),
                               f32(weights), p.get(), rows, k, c);
  else
    cuda::moe_combine_backward(f32(d_expert_out), f32(d_weights), f32(d_out), f32(expert_out),
                               f32(weights), p.get(), rows, k, c);
}

}  // namespace loom::ops::cuda_impl
