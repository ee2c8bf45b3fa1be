// The op layer's mixture-of-experts row movement (ops.hpp, "mixture of experts"): the checks,
// then loom::cpu's loops or the CUDA kernels.
#include "loom/core/error.hpp"
#include "loom/kernels/cpu/moe.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/kernels/ops_common.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/ops_cuda.hpp"
#endif

namespace loom::ops {

using detail::device_of;
using detail::require_2d;
using detail::require_cpu_f32;

namespace {

// Tokens of a call: position holds k slots per token, each -1 or a row of `routed` (which has
// `width` columns, as every token row does). Returns the token count.
int64_t checked_slots(const char* op, std::span<const int32_t> position, int64_t k,
                      const Tensor& tokens, const Tensor& routed) {
  require_2d(op, "token rows", tokens);
  require_2d(op, "routed rows", routed);
  if (k < 1 || position.size() % static_cast<size_t>(k) != 0)
    throw_error("ops::", op, ": ", position.size(), " slot positions for ", k, " slots per token");
  const auto rows = static_cast<int64_t>(position.size()) / k;
  if (tokens.size(0) != rows || tokens.size(1) != routed.size(1))
    throw_error("ops::", op, ": token rows ", shape_to_string(tokens.shape()), " and routed rows ",
                shape_to_string(routed.shape()), " for ", rows, " tokens of ", k, " slots");
  for (size_t s = 0; s < position.size(); ++s)
    if (position[s] < -1 || position[s] >= routed.size(0))
      throw_error("ops::", op, ": slot ", s, " is at routed row ", position[s],
                  ", expected -1 (dropped) or [0, ", routed.size(0), ")");
  return rows;
}

void check_weights(const char* op, const Tensor& weights, int64_t rows, int64_t k) {
  if (weights.dtype() != DType::F32 || weights.numel() != rows * k)
    throw_error("ops::", op, ": router weights ", dtype_name(weights.dtype()), " ",
                shape_to_string(weights.shape()), ", expected F32 [", rows, ", ", k, "]");
}

}  // namespace

void moe_gather(const Tensor& routed, const Tensor& x, std::span<const int32_t> position,
                int64_t k) {
  const Device device = device_of("moe_gather", {&routed, &x});
  const int64_t rows = checked_slots("moe_gather", position, k, x, routed);
  LOOM_OPS_ON_CUDA(device, moe_gather(routed, x, position, k))
  require_cpu_f32("moe_gather", {&routed, &x});
  cpu::moe_gather(routed.f32(), x.f32(), position.data(), rows, k, x.size(1));
}

void moe_gather_backward(const Tensor& d_x, const Tensor& d_routed,
                         std::span<const int32_t> position, int64_t k) {
  const Device device = device_of("moe_gather_backward", {&d_x, &d_routed});
  const int64_t rows = checked_slots("moe_gather_backward", position, k, d_x, d_routed);
  LOOM_OPS_ON_CUDA(device, moe_gather_backward(d_x, d_routed, position, k))
  require_cpu_f32("moe_gather_backward", {&d_x, &d_routed});
  cpu::moe_gather_backward(d_x.f32(), d_routed.f32(), position.data(), rows, k, d_x.size(1));
}

void moe_combine(const Tensor& out, const Tensor& expert_out, const Tensor& weights,
                 std::span<const int32_t> position, int64_t k) {
  const Device device = device_of("moe_combine", {&out, &expert_out, &weights});
  const int64_t rows = checked_slots("moe_combine", position, k, out, expert_out);
  check_weights("moe_combine", weights, rows, k);
  LOOM_OPS_ON_CUDA(device, moe_combine(out, expert_out, weights, position, k))
  require_cpu_f32("moe_combine", {&out, &expert_out});
  cpu::moe_combine(out.f32(), expert_out.f32(), weights.f32(), position.data(), rows, k,
                   out.size(1));
}

void moe_combine_backward(const Tensor& d_expert_out, const Tensor& d_weights, const Tensor& d_out,
                          const Tensor& expert_out, const Tensor& weights,
                          std::span<const int32_t> position, int64_t k) {
  const Device device =
      device_of("moe_combine_backward", {&d_expert_out, &d_weights, &d_out, &expert_out, &weights});
  const int64_t rows = checked_slots("moe_combine_backward", position, k, d_out, expert_out);
  check_weights("moe_combine_backward", weights, rows, k);
  check_weights("moe_combine_backward", d_weights, rows, k);
  if (d_expert_out.shape() != expert_out.shape())
    throw_error("ops::moe_combine_backward: d_expert_out ", shape_to_string(d_expert_out.shape()),
                " for expert_out ", shape_to_string(expert_out.shape()));
  LOOM_OPS_ON_CUDA(device, moe_combine_backward(d_expert_out, d_weights, d_out, expert_out, weights,
                                                position, k))
  require_cpu_f32("moe_combine_backward", {&d_expert_out, &d_out, &expert_out});
  cpu::moe_combine_backward(d_expert_out.f32(), d_weights.f32(), d_out.f32(), expert_out.f32(),
                            weights.f32(), position.data(), rows, k, d_out.size(1));
}

}  // namespace loom::ops
