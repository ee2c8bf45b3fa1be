// The op layer's optimizer ops (ops.hpp): the gradient norm's sums of squares and AdamW, one
// tensor at a time or all of them in one CUDA launch; the checks, then loom::cpu's loops or the
// CUDA kernels.
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/adamw.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/kernels/ops_common.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/ops_cuda.hpp"
#endif

namespace loom::ops {

using detail::device_of;
using detail::require_cpu_f32;

double sum_of_squares(const Tensor& x) {
  const Device device = device_of("sum_of_squares", {&x});
  LOOM_OPS_ON_CUDA(device, sum_of_squares(x))
  require_cpu_f32("sum_of_squares", {&x});
  return cpu::sum_of_squares(x.f32(), x.numel());
}

std::vector<double> sums_of_squares(const std::vector<const Tensor*>& xs) {
  bool all_cuda = !xs.empty();
  for (const Tensor* x : xs) all_cuda = all_cuda && x->device() == Device::CUDA;
  if (all_cuda) {
    LOOM_OPS_ON_CUDA(Device::CUDA, sums_of_squares(xs))
  }
  std::vector<double> sums;
  sums.reserve(xs.size());
  for (const Tensor* x : xs) sums.push_back(sum_of_squares(*x));
  return sums;
}

namespace {
// adamw_update's checks, shared with adamw_update_many; returns the tensors' device.
Device check_adamw(const Tensor& param, const Tensor& working, const Tensor& grad,
                   const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  const Device device = device_of("adamw_update", {&param, &working, &grad, &exp_avg, &exp_avg_sq});
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq})
    if (t->dtype() != DType::F32 || t->numel() != param.numel())
      throw_error("ops::adamw_update: parameter, gradient and moments must be F32 of ",
                  param.numel(), " elements; got a ", dtype_name(t->dtype()), " ",
                  shape_to_string(t->shape()));
  if (working.defined() && working.numel() != param.numel())
    throw_error("ops::adamw_update: working copy ", shape_to_string(working.shape()), " for ",
                shape_to_string(param.shape()));
  return device;
}
}  // namespace

void adamw_update(const Tensor& param, const Tensor& working, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWStep& step) {
  const Device device = check_adamw(param, working, grad, exp_avg, exp_avg_sq);
  LOOM_OPS_ON_CUDA(device, adamw_update(param, working, grad, exp_avg, exp_avg_sq, step))
  require_cpu_f32("adamw_update", {&working});
  cpu::adamw_update(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), param.numel(), step);
  if (working.defined()) {
    working.copy_from(param);
    cpu::round_to_bf16_inplace(working.f32(), working.numel());
  }
}

void adamw_update_many(std::span<const AdamWTensors> tensors) {
  bool all_cuda = !tensors.empty();
  for (const AdamWTensors& t : tensors) all_cuda = all_cuda && t.param.device() == Device::CUDA;
  if (all_cuda) {
    for (const AdamWTensors& t : tensors)  // every check before any update
      check_adamw(t.param, t.working, t.grad, t.exp_avg, t.exp_avg_sq);
    LOOM_OPS_ON_CUDA(Device::CUDA, adamw_update_many(tensors))
  }
  for (const AdamWTensors& t : tensors)
    adamw_update(t.param, t.working, t.grad, t.exp_avg, t.exp_avg_sq, t.step);
}

}  // namespace loom::ops
