#include "loom/kernels/ops.hpp"
#include "loom/kernels/weight_grads.hpp"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/activations.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cpu/norms.hpp"
#include "loom/kernels/ops_common.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/ops_cuda.hpp"
#endif

namespace loom::ops {

using detail::checked_positions;
using detail::device_of;
using detail::f32_or_null;
using detail::require_2d;
using detail::require_cpu_f32;

namespace {

// Checks a linear layer's operands; returns (rows, in, out).
struct LinearDims {
  int64_t rows, in, out;
};
LinearDims check_linear(const char* op, const Tensor& y, int64_t y_col, const Tensor& input,
                        const Tensor& weight) {
  require_2d(op, "the output", y);
  require_2d(op, "the input", input);
  require_2d(op, "the weight", weight);
  const int64_t rows = input.size(0), in = weight.size(1), out = weight.size(0);
  if (input.size(1) != in)
    throw_error("ops::", op, ": input ", shape_to_string(input.shape()), " does not match weight ",
                shape_to_string(weight.shape()), " ([out, in])");
  if (y.size(0) != rows || y_col < 0 || y_col + out > y.size(1))
    throw_error("ops::", op, ": columns [", y_col, ", ", y_col + out, ") of ",
                shape_to_string(y.shape()), " cannot hold ", rows, " rows of ", out, " outputs");
  return {rows, in, out};
}

}  // namespace


void linear_forward(const Tensor& out, int64_t out_col, const Tensor& input, const Tensor& weight,
                    const Tensor* bias) {
  const Device device = device_of("linear_forward", {&out, &input, &weight, bias});
  const LinearDims d = check_linear("linear_forward", out, out_col, input, weight);
  if (bias && bias->defined() && bias->numel() != d.out)
    throw_error("ops::linear_forward: bias of ", bias->numel(), " for ", d.out, " outputs");
  LOOM_OPS_ON_CUDA(device, linear_forward(out, out_col, input, weight, bias))
  require_cpu_f32("linear_forward", {&out, &input, &weight, bias});
  cpu::linear_forward(out.f32() + out_col, out.size(1), input.f32(), weight.f32(),
                      f32_or_null(bias), d.rows, d.in, d.out);
}

void linear_backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                     const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                     const Tensor& input, const Tensor& weight) {
  const Device device =
      device_of("linear_backward", {&d_input, &d_weight, &d_bias, &d_out, &input, &weight});
  const LinearDims d = check_linear("linear_backward", d_out, d_out_col, input, weight);
  if (d_weight.numel() != weight.numel() || d_weight.dtype() != DType::F32)
    throw_error("ops::linear_backward: d_weight must be F32 shaped like the weight ",
                shape_to_string(weight.shape()));
  if (d_input.defined() && d_input.numel() != input.numel())
    throw_error("ops::linear_backward: d_input ", shape_to_string(d_input.shape()), " for input ",
                shape_to_string(input.shape()));
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    // B: the input gradient now (the same GEMM as below). W: the weight and bias gradients
    // from copies of the output-gradient columns and the input.
    if (d_input.defined()) linear_input_grad(d_input, accumulate_input, d_out, d_out_col, weight);
    const bool narrow = d_out.device() == Device::CPU;  // copy_columns is a CPU op
    Tensor kept_out = narrow ? later->keep_columns(d_out, d_out_col, d.out) : later->keep(d_out);
    const int64_t kept_col = narrow ? 0 : d_out_col;
    later->add([d_weight, d_bias, kept_out, kept_col, kept_in = later->keep(input), weight] {
      linear_backward(Tensor(), false, d_weight, d_bias, kept_out, kept_col, kept_in, weight);
    });
    return;
  }
  LOOM_OPS_ON_CUDA(device, linear_backward(d_input, accumulate_input, d_weight, d_bias, d_out,
                                           d_out_col, input, weight))
  require_cpu_f32("linear_backward", {&d_input, &d_bias, &d_out, &input, &weight});
  cpu::linear_backward(f32_or_null(d_input), accumulate_input, d_weight.f32(), f32_or_null(d_bias),
                       d_out.f32() + d_out_col, d_out.size(1), input.f32(), weight.f32(), d.rows,
                       d.in, d.out);
}

bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& input,
                         const Tensor& weight, const Tensor* bias) {
  const Device device = device_of("linear_gelu_forward", {&act, &pre, &input, &weight, bias});
  const LinearDims d = check_linear("linear_gelu_forward", pre, 0, input, weight);
  if (act.shape() != pre.shape())
    throw_error("ops::linear_gelu_forward: act ", shape_to_string(act.shape()), " and pre ",
                shape_to_string(pre.shape()), " differ");
  if (bias && bias->defined() && bias->numel() != d.out)
    throw_error("ops::linear_gelu_forward: bias of ", bias->numel(), " for ", d.out, " outputs");
  LOOM_OPS_ON_CUDA(device, linear_gelu_forward(act, pre, input, weight, bias))
  return false;
}

bool linear_backward_through_gelu(const Tensor& d_pre, const Tensor& d_weight, const Tensor& d_bias,
                                  const Tensor& d_out, const Tensor& input, const Tensor& weight,
                                  const Tensor& pre) {
  const Device device = device_of("linear_backward_through_gelu",
                                  {&d_pre, &d_weight, &d_bias, &d_out, &input, &weight, &pre});
  check_linear("linear_backward_through_gelu", d_out, 0, input, weight);
  if (d_pre.shape() != input.shape() || pre.shape() != input.shape())
    throw_error("ops::linear_backward_through_gelu: d_pre ", shape_to_string(d_pre.shape()),
                " and pre ", shape_to_string(pre.shape()), " must be shaped like the input ",
                shape_to_string(input.shape()));
  LOOM_OPS_ON_CUDA(device,
                   linear_backward_through_gelu(d_pre, d_weight, d_bias, d_out, input, weight, pre))
  return false;
}

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& input, const Tensor& weight, const Tensor& bias, float eps) {
  const Device device =
      device_of("layernorm_forward", {&out, &mean, &rstd, &input, &weight, &bias});
  LOOM_OPS_ON_CUDA(device, layernorm_forward(out, mean, rstd, input, weight, bias, eps))
  require_cpu_f32("layernorm_forward", {&out, &input, &weight, &bias});
  const int64_t dim = weight.numel();
  cpu::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), input.f32(), weight.f32(), bias.f32(),
                         input.numel() / dim, dim, eps);
}

namespace {

// A norm's backward with one half unwanted (an undefined d_input, or undefined parameter
// gradients): the kernel still computes both, the unwanted half into scratch, so each half is
// the very arithmetic of the whole backward (one loop computes both; a loop computing one alone
// may be contracted into FMAs differently). Norms cost little next to the GEMMs.
Tensor or_scratch(const Tensor& t, const Tensor& like, DType dtype) {
  if (t.defined()) return t;
  return Tensor::zeros(like.shape(), dtype, MemCategory::Workspace, like.device());
}

void layernorm_backward_part(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_bias,
                             const Tensor& d_out, const Tensor& input, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd) {
  const Device device = device_of(
      "layernorm_backward", {&d_input, &d_weight, &d_bias, &d_out, &input, &weight, &mean, &rstd});
  LOOM_OPS_ON_CUDA(device, layernorm_backward(or_scratch(d_input, input, input.dtype()),
                                              or_scratch(d_weight, weight, DType::F32),
                                              or_scratch(d_bias, weight, DType::F32), d_out, input,
                                              weight, mean, rstd))
  const Tensor dx = or_scratch(d_input, input, input.dtype());
  const Tensor dw = or_scratch(d_weight, weight, DType::F32), db = or_scratch(d_bias, weight, DType::F32);
  require_cpu_f32("layernorm_backward", {&dx, &d_out, &input, &weight});
  const int64_t dim = weight.numel();
  cpu::layernorm_backward(dx.f32(), dw.f32(), db.f32(), d_out.f32(), input.f32(), weight.f32(),
                          mean.f32(), rstd.f32(), input.numel() / dim, dim);
}

void rmsnorm_backward_part(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_out,
                           const Tensor& input, const Tensor& weight, const Tensor& rstd) {
  const Device device =
      device_of("rmsnorm_backward", {&d_input, &d_weight, &d_out, &input, &weight, &rstd});
  LOOM_OPS_ON_CUDA(device, rmsnorm_backward(or_scratch(d_input, input, input.dtype()),
                                            or_scratch(d_weight, weight, DType::F32), d_out, input,
                                            weight, rstd))
  const Tensor dx = or_scratch(d_input, input, input.dtype());
  const Tensor dw = or_scratch(d_weight, weight, DType::F32);
  require_cpu_f32("rmsnorm_backward", {&dx, &d_out, &input, &weight});
  const int64_t dim = weight.numel();
  cpu::rmsnorm_backward(dx.f32(), dw.f32(), d_out.f32(), input.f32(), weight.f32(), rstd.f32(),
                        input.numel() / dim, dim);
}

}  // namespace

void layernorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_bias,
                        const Tensor& d_out, const Tensor& input, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd) {
  const Device device = device_of(
      "layernorm_backward", {&d_input, &d_weight, &d_bias, &d_out, &input, &weight, &mean, &rstd});
  (void)device;
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    layernorm_backward_part(d_input, Tensor(), Tensor(), d_out, input, weight, mean, rstd);
    later->add([d_weight, d_bias, kept_out = later->keep(d_out), kept_in = later->keep(input), weight,
                kept_mean = later->keep(mean), kept_rstd = later->keep(rstd)] {
      layernorm_backward_part(Tensor(), d_weight, d_bias, kept_out, kept_in, weight, kept_mean, kept_rstd);
    });
    return;
  }
  layernorm_backward_part(d_input, d_weight, d_bias, d_out, input, weight, mean, rstd);
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& input,
                     const Tensor& weight, float eps) {
  const Device device = device_of("rmsnorm_forward", {&out, &rstd, &input, &weight});
  LOOM_OPS_ON_CUDA(device, rmsnorm_forward(out, rstd, input, weight, eps))
  require_cpu_f32("rmsnorm_forward", {&out, &input, &weight});
  const int64_t dim = weight.numel();
  cpu::rmsnorm_forward(out.f32(), rstd.f32(), input.f32(), weight.f32(), input.numel() / dim, dim,
                       eps);
}

void add_norm_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                      const Tensor& residual, const Tensor& delta, const Tensor& weight,
                      const Tensor& bias, float eps, bool round_sum_to_bf16) {
  const Device device =
      device_of("add_norm_forward", {&sum, &out, &mean, &rstd, &residual, &delta, &weight, &bias});
  LOOM_CHECK(
      sum.numel() == residual.numel() && sum.numel() == delta.numel() && sum.numel() == out.numel(),
      "ops::add_norm_forward: sum ", shape_to_string(sum.shape()), ", residual ",
      shape_to_string(residual.shape()), ", delta ", shape_to_string(delta.shape()), ", out ",
      shape_to_string(out.shape()));
#ifdef LOOM_HAVE_CUDA
  // The fused kernel takes bf16 storage; it declines (does nothing) otherwise.
  if (device == Device::CUDA &&
      cuda_impl::add_norm_forward(sum, out, mean, rstd, residual, delta, weight, bias, eps))
    return;
#else
  (void)device;
#endif
  // Unfused: the sum where it is stored, then the norm of it.
  if (sum.raw() == delta.raw()) {
    add_into(sum, residual);
  } else {
    if (sum.raw() != residual.raw()) sum.copy_from(residual);
    add_into(sum, delta);
  }
  if (round_sum_to_bf16) round_to_bf16_(sum);
  if (bias.defined())
    layernorm_forward(out, mean, rstd, sum, weight, bias, eps);
  else
    rmsnorm_forward(out, rstd, sum, weight, eps);
}

void rmsnorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_out,
                      const Tensor& input, const Tensor& weight, const Tensor& rstd) {
  const Device device =
      device_of("rmsnorm_backward", {&d_input, &d_weight, &d_out, &input, &weight, &rstd});
  (void)device;
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    rmsnorm_backward_part(d_input, Tensor(), d_out, input, weight, rstd);
    later->add([d_weight, kept_out = later->keep(d_out), kept_in = later->keep(input), weight,
                kept_rstd = later->keep(rstd)] {
      rmsnorm_backward_part(Tensor(), d_weight, kept_out, kept_in, weight, kept_rstd);
    });
    return;
  }
  rmsnorm_backward_part(d_input, d_weight, d_out, input, weight, rstd);
}

void gelu_forward(const Tensor& out, const Tensor& input) {
  const Device device = device_of("gelu_forward", {&out, &input});
  LOOM_CHECK(out.numel() == input.numel(), "ops::gelu_forward: ", out.numel(), " outputs for ",
             input.numel());
  LOOM_OPS_ON_CUDA(device, gelu_forward(out, input))
  require_cpu_f32("gelu_forward", {&out, &input});
  cpu::gelu_forward(out.f32(), input.f32(), input.numel());
}

void gelu_backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) {
  const Device device = device_of("gelu_backward", {&d_input, &d_out, &input});
  LOOM_OPS_ON_CUDA(device, gelu_backward(d_input, d_out, input))
  require_cpu_f32("gelu_backward", {&d_input, &d_out, &input});
  cpu::gelu_backward(d_input.f32(), d_out.f32(), input.f32(), input.numel());
}

void swiglu_forward(const Tensor& out, const Tensor& fused) {
  const Device device = device_of("swiglu_forward", {&out, &fused});
  require_2d("swiglu_forward", "out", out);
  require_2d("swiglu_forward", "the fused gate|up", fused);
  if (fused.size(0) != out.size(0) || fused.size(1) != 2 * out.size(1))
    throw_error("ops::swiglu_forward: gate|up ", shape_to_string(fused.shape()), " for output ",
                shape_to_string(out.shape()), " (expected [rows, 2 dim])");
  LOOM_OPS_ON_CUDA(device, swiglu_forward(out, fused))
  require_cpu_f32("swiglu_forward", {&out, &fused});
  const int64_t dim = out.size(1);
  cpu::swiglu_forward(out.f32(), fused.f32(), fused.f32() + dim, out.size(0), dim, 2 * dim);
}

void swiglu_backward(const Tensor& d_fused, const Tensor& d_out, const Tensor& fused) {
  const Device device = device_of("swiglu_backward", {&d_fused, &d_out, &fused});
  require_2d("swiglu_backward", "d_out", d_out);
  LOOM_CHECK(fused.numel() == 2 * d_out.numel() && d_fused.numel() == fused.numel(),
             "ops::swiglu_backward: gate|up ", shape_to_string(fused.shape()), " for d_out ",
             shape_to_string(d_out.shape()));
  LOOM_OPS_ON_CUDA(device, swiglu_backward(d_fused, d_out, fused))
  require_cpu_f32("swiglu_backward", {&d_fused, &d_out, &fused});
  const int64_t dim = d_out.size(1);
  cpu::swiglu_backward(d_fused.f32(), d_fused.f32() + dim, d_out.f32(), fused.f32(),
                       fused.f32() + dim, d_out.size(0), dim, 2 * dim);
}

namespace {
// Key ranges: 2 per query row of batch x q_len. Causal self-attention: 0 <= begin < end <= the
// row's own index + 1 (every row sees itself). Queries over other keys: 0 <= begin <= end <=
// kv_len (a row may see none of a block).
void check_key_ranges(const char* op, std::span<const int32_t> ranges, int64_t batch, int64_t q_len,
                      bool causal, int64_t kv_len) {
  const int64_t rows = batch * q_len;
  if (static_cast<int64_t>(ranges.size()) != 2 * rows)
    throw_error("ops::", op, ": ", ranges.size(), " key-range values for ", rows,
                " query rows, expected 2 per row (", 2 * rows, ")");
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row % q_len, begin = ranges[2 * row], end = ranges[2 * row + 1];
    const int64_t limit = causal ? i + 1 : kv_len;
    if (begin < 0 || end > limit || (causal ? begin >= end : begin > end))
      throw_error("ops::", op, ": query row ", i, " of sequence ", row / q_len, " sees keys [", begin,
                  ", ", end, "), expected 0 <= begin ", causal ? "<" : "<=", " end <= ", limit,
                  causal ? " (causal and not empty)" : "");
  }
}

// Key ranges fit the rows and keep every row causal and non-empty (checked on the host, before
// a device kernel reads them).
const int32_t* checked_key_ranges(const char* op, std::span<const int32_t> ranges,
                                  const AttentionShape& shape) {
  if (ranges.empty()) return nullptr;
  check_key_ranges(op, ranges, shape.batch, shape.seq_len, true, shape.seq_len);
  return ranges.data();
}
}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& shape, std::span<const int32_t> key_ranges) {
  const Device device = device_of("attention_forward", {&out, &lse, &qkv});
  const int64_t rows = shape.batch * shape.seq_len;
  if (qkv.numel() != rows * shape.qkv_ld() || out.numel() != rows * shape.out_ld() ||
      lse.numel() != rows * shape.heads || lse.dtype() != DType::F32)
    throw_error("ops::attention_forward: qkv ", shape_to_string(qkv.shape()), ", out ",
                shape_to_string(out.shape()), ", lse ", shape_to_string(lse.shape()),
                " do not fit batch ", shape.batch, " x ", shape.seq_len, ", ", shape.heads,
                " heads, ", shape.kv_heads, " kv heads of ", shape.head_dim);
  const int32_t* ranges = checked_key_ranges("attention_forward", key_ranges, shape);
  LOOM_OPS_ON_CUDA(device, attention_forward(out, lse, qkv, shape, key_ranges))
  require_cpu_f32("attention_forward", {&out, &qkv});
  cpu::attention_forward(out.f32(), lse.f32(), qkv.f32(), shape, ranges);
}

void attention_backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                        std::span<const int32_t> key_ranges) {
  const Device device = device_of("attention_backward", {&d_qkv, &d_out, &qkv, &out, &lse});
  LOOM_CHECK(d_qkv.numel() == qkv.numel() && d_out.numel() == out.numel(),
             "ops::attention_backward: d_qkv ", shape_to_string(d_qkv.shape()), " / d_out ",
             shape_to_string(d_out.shape()), " for qkv ", shape_to_string(qkv.shape()), " / out ",
             shape_to_string(out.shape()));
  const int32_t* ranges = checked_key_ranges("attention_backward", key_ranges, shape);
  LOOM_OPS_ON_CUDA(device, attention_backward(d_qkv, d_out, qkv, out, lse, shape, key_ranges))
  require_cpu_f32("attention_backward", {&d_qkv, &d_out, &qkv, &out});
  cpu::attention_backward(d_qkv.f32(), d_out.f32(), qkv.f32(), out.f32(), lse.f32(), shape, ranges);
}

namespace {
// Shapes and ranges of a cross-attention call; returns the ranges' pointer.
const int32_t* checked_cross(const char* op, const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& kv, const CrossAttentionShape& s,
                             std::span<const int32_t> ranges) {
  require_2d(op, "q", q);
  require_2d(op, "kv", kv);
  const int64_t hd = s.heads * s.head_dim;
  if (s.heads % s.kv_heads != 0 || q.size(0) != s.batch * s.q_len || q.size(1) < hd ||
      kv.size(0) != s.batch * s.kv_len || kv.size(1) != 2 * s.kv_heads * s.head_dim ||
      out.numel() != s.batch * s.q_len * hd || lse.numel() != s.batch * s.heads * s.q_len)
    throw_error("ops::", op, ": q ", shape_to_string(q.shape()), ", kv ", shape_to_string(kv.shape()),
                ", out ", shape_to_string(out.shape()), ", lse ", shape_to_string(lse.shape()),
                " do not fit batch ", s.batch, " x (", s.q_len, " queries over ", s.kv_len, " keys), ",
                s.heads, " heads, ", s.kv_heads, " kv heads of ", s.head_dim);
  check_key_ranges(op, ranges, s.batch, s.q_len, false, s.kv_len);
  return ranges.data();
}
}  // namespace

void cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                             const CrossAttentionShape& shape, std::span<const int32_t> key_ranges) {
  const Device device = device_of("cross_attention_forward", {&out, &lse, &q, &kv});
  const int32_t* ranges = checked_cross("cross_attention_forward", out, lse, q, kv, shape, key_ranges);
  LOOM_OPS_ON_CUDA(device, cross_attention_forward(out, lse, q, kv, shape, key_ranges))
  require_cpu_f32("cross_attention_forward", {&out, &lse, &q, &kv});
  cpu::cross_attention_forward(out.f32(), lse.f32(), q.f32(), q.size(1), kv.f32(), kv.size(1), shape,
                               ranges);
}

void cross_attention_backward(const Tensor& d_q, const Tensor& d_kv, const Tensor& d_out,
                              const Tensor& q, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const CrossAttentionShape& shape, std::span<const int32_t> key_ranges) {
  const Device device =
      device_of("cross_attention_backward", {&d_q, &d_kv, &d_out, &q, &kv, &out, &lse});
  const int32_t* ranges = checked_cross("cross_attention_backward", out, lse, q, kv, shape, key_ranges);
  LOOM_CHECK(d_q.shape() == q.shape() && d_kv.shape() == kv.shape() && d_out.numel() == out.numel(),
             "ops::cross_attention_backward: d_q ", shape_to_string(d_q.shape()), " / d_kv ",
             shape_to_string(d_kv.shape()), " / d_out ", shape_to_string(d_out.shape()), " for q ",
             shape_to_string(q.shape()), " / kv ", shape_to_string(kv.shape()), " / out ",
             shape_to_string(out.shape()));
  LOOM_OPS_ON_CUDA(device,
                   cross_attention_backward(d_q, d_kv, d_out, q, kv, out, lse, shape, key_ranges))
  require_cpu_f32("cross_attention_backward", {&d_q, &d_kv, &d_out, &q, &kv, &out, &lse});
  cpu::cross_attention_backward(d_q.f32(), d_kv.f32(), d_out.f32(), q.f32(), q.size(1), kv.f32(),
                                kv.size(1), out.f32(), lse.f32(), shape, ranges);
}

void merge_attention_partials(const Tensor& out, const Tensor& lse, const Tensor& part,
                              const Tensor& part_lse, int64_t batch, int64_t heads) {
  const Device device = device_of("merge_attention_partials", {&out, &lse, &part, &part_lse});
  require_2d("merge_attention_partials", "out", out);
  const int64_t rows = out.size(0);
  if (batch <= 0 || heads <= 0 || rows % batch != 0 || out.size(1) % heads != 0 ||
      part.numel() != out.numel() || lse.numel() != rows * heads || part_lse.numel() != lse.numel())
    throw_error("ops::merge_attention_partials: out ", shape_to_string(out.shape()), ", part ",
                shape_to_string(part.shape()), ", lse ", shape_to_string(lse.shape()), ", part_lse ",
                shape_to_string(part_lse.shape()), " do not fit batch ", batch, " x ", heads, " heads");
  LOOM_OPS_ON_CUDA(device, merge_attention_partials(out, lse, part, part_lse, batch, heads))
  require_cpu_f32("merge_attention_partials", {&out, &lse, &part, &part_lse});
  cpu::merge_attention_partials(out.f32(), lse.f32(), part.f32(), part_lse.f32(), batch, rows / batch,
                                heads, out.size(1) / heads);
}

void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols) {
  const Device device = device_of("copy_columns", {&dst, &src});
  require_2d("copy_columns", "dst", dst);
  require_2d("copy_columns", "src", src);
  if (dst.size(0) != src.size(0) || cols < 0 || dst_col < 0 || src_col < 0 || dst_col + cols > dst.size(1) ||
      src_col + cols > src.size(1))
    throw_error("ops::copy_columns: ", cols, " columns from ", src_col, " of ", shape_to_string(src.shape()),
                " to ", dst_col, " of ", shape_to_string(dst.shape()));
  LOOM_OPS_ON_CUDA(device, copy_columns(dst, dst_col, src, src_col, cols))
  require_cpu_f32("copy_columns", {&dst, &src});
  const int64_t rows = dst.size(0), dst_ld = dst.size(1), src_ld = src.size(1);
  float* d = dst.f32();
  const float* s = src.f32();
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(d + r * dst_ld + dst_col, s + r * src_ld + src_col, static_cast<size_t>(cols) * sizeof(float));
}

std::string cuda_kernel_summary(Device device, int64_t head_dim, bool bf16) {
  if (device != Device::CUDA) return {};
#ifdef LOOM_HAVE_CUDA
  return cuda_impl::kernel_summary(head_dim, bf16);
#else
  (void)head_dim, (void)bf16;
  return {};
#endif
}

int64_t max_attention_head_dim(Device device) {
  if (device == Device::CPU) return std::numeric_limits<int64_t>::max();
#ifdef LOOM_HAVE_CUDA
  return cuda_impl::max_attention_head_dim();
#else
  return 0;
#endif
}

// ---- RoPE -------------------------------------------------------------------------------

#ifdef LOOM_HAVE_CUDA
struct Rope::DeviceTable {
  std::shared_ptr<void> table;  // cuda_impl's device copy
};
#else
struct Rope::DeviceTable {};
#endif

Rope::Rope(int64_t head_dim, int64_t max_positions, double theta, const cpu::RopeScaling& scaling)
    : table_(cpu::make_rope_table(head_dim, max_positions, theta, scaling)) {}
Rope::~Rope() = default;

void Rope::apply(const Tensor& x, int64_t batch, int64_t seq_len, int64_t heads,
                 bool inverse, std::span<const int32_t> positions) const {
  require_2d("rope_apply", "x", x);
  if (x.size(0) != batch * seq_len || heads * table_.head_dim > x.size(1))
    throw_error("ops::rope_apply: ", heads, " heads of ", table_.head_dim, " in rows of ",
                shape_to_string(x.shape()), " for batch ", batch, " x ", seq_len);
  if (seq_len > table_.max_positions)
    throw_error("ops::rope_apply: sequence ", seq_len, " is longer than the table's ",
                table_.max_positions);
  const int32_t* ids =
      checked_positions("rope_apply", positions, 0, batch * seq_len, table_.max_positions);
#ifdef LOOM_HAVE_CUDA
  if (x.device() == Device::CUDA) {
    if (!device_)
      device_ = std::make_unique<DeviceTable>(DeviceTable{cuda_impl::upload_rope_table(table_)});
    cuda_impl::rope_apply(x, batch, seq_len, heads, device_->table.get(), inverse, ids);
    return;
  }
#endif
  require_cpu_f32("rope_apply", {&x});
  cpu::rope_apply(x.f32(), batch, seq_len, heads, x.size(1), table_, inverse, ids);
}

// ---- embeddings, head -------------------------------------------------------------------

void embedding_forward(const Tensor& out, const int32_t* tokens, const Tensor& token_table,
                       const Tensor* position_table, int64_t batch, int64_t seq_len,
                       std::span<const int32_t> positions) {
  const Device device = device_of("embedding_forward", {&out, &token_table, position_table});
  const int32_t* ids = position_table ? checked_positions("embedding_forward", positions, 0,
                                                          batch * seq_len, position_table->size(0))
                                      : nullptr;
  const int64_t dim = token_table.size(1);
  LOOM_CHECK(out.numel() == batch * seq_len * dim, "ops::embedding_forward: out ",
             shape_to_string(out.shape()), " for ", batch, " x ", seq_len, " tokens of ", dim);
  LOOM_OPS_ON_CUDA(device,
                   embedding_forward(out, tokens, token_table, position_table, batch, seq_len, ids))
  require_cpu_f32("embedding_forward", {&out, &token_table, position_table});
  cpu::embedding_forward(out.f32(), tokens, token_table.f32(), f32_or_null(position_table), batch,
                         seq_len, dim, ids);
}

void embedding_backward(const Tensor& d_token_table, const Tensor* d_position_table,
                        const Tensor& d_out, const int32_t* tokens, int64_t batch,
                        int64_t seq_len, std::span<const int32_t> positions) {
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    // W alone: the tables' gradients, from a copy of d_out and of the host ids.
    std::vector<int32_t> ids(tokens, tokens + batch * seq_len);
    const Tensor position_grad = d_position_table ? *d_position_table : Tensor();
    later->add([d_token_table, position_grad, kept = later->keep(d_out), ids = std::move(ids), batch, seq_len,
                positions_copy = std::vector<int32_t>(positions.begin(), positions.end())] {
      embedding_backward(d_token_table, position_grad.defined() ? &position_grad : nullptr, kept, ids.data(),
                         batch, seq_len, positions_copy);
    });
    return;
  }
  const Device device = device_of("embedding_backward", {&d_token_table, d_position_table, &d_out});
  const int32_t* ids = d_position_table
                           ? checked_positions("embedding_backward", positions, 0, batch * seq_len,
                                               d_position_table->size(0))
                           : nullptr;
  LOOM_OPS_ON_CUDA(device, embedding_backward(d_token_table, d_position_table, d_out, tokens, batch,
                                              seq_len, ids))
  require_cpu_f32("embedding_backward", {&d_token_table, d_position_table, &d_out});
  cpu::embedding_backward(f32_or_null(d_token_table), f32_or_null(d_position_table), d_out.f32(),
                          tokens, batch, seq_len, d_out.numel() / (batch * seq_len), ids);
}

double lm_head_cross_entropy(const CrossEntropyArgs& args) {
  const Device device = device_of("lm_head_cross_entropy",
                                  {&args.hidden, &args.weight, &args.d_hidden, &args.d_weight});
  require_2d("lm_head_cross_entropy", "hidden", args.hidden);
  require_2d("lm_head_cross_entropy", "weight", args.weight);
  if (args.hidden.size(1) != args.weight.size(1))
    throw_error("ops::lm_head_cross_entropy: hidden ", shape_to_string(args.hidden.shape()),
                " and head ", shape_to_string(args.weight.shape()), " differ in width");
  LOOM_OPS_ON_CUDA(device, lm_head_cross_entropy(args))
  require_cpu_f32("lm_head_cross_entropy",
                  {&args.hidden, &args.weight, &args.d_hidden, &args.d_weight});
  cpu::CrossEntropyArgs a{};
  a.hidden = args.hidden.f32();
  a.weight = args.weight.f32();
  a.targets = args.targets;
  a.rows = args.hidden.size(0);
  a.dim = args.hidden.size(1);
  a.vocab = args.weight.size(0);
  a.vocab_chunk = args.vocab_chunk;
  a.grad_scale = args.grad_scale;
  a.d_hidden = f32_or_null(args.d_hidden);
  a.d_weight = f32_or_null(args.d_weight);
  if (args.workspace.defined() &&
      args.workspace.numel() >= a.rows * std::min(a.vocab_chunk, a.vocab) &&
      args.workspace.device() == Device::CPU && args.workspace.dtype() == DType::F32)
    a.workspace = args.workspace.f32();
  const double loss = cpu::lm_head_cross_entropy(a);
  if (!args.loss_sum) return loss;
  *args.loss_sum += loss;
  return 0.0;
}

// ---- elementwise ------------------------------------------------------------------------

void add_into(const Tensor& dst, const Tensor& src) {
  const Device device = device_of("add_into", {&dst, &src});
  LOOM_CHECK(dst.numel() == src.numel(), "ops::add_into: ", shape_to_string(src.shape()), " into ",
             shape_to_string(dst.shape()));
  LOOM_OPS_ON_CUDA(device, add_into(dst, src))
  require_cpu_f32("add_into", {&dst, &src});
  cpu::add_into(dst.f32(), src.f32(), dst.numel());
}

void scale_(const Tensor& x, float factor) {
  const Device device = device_of("scale_", {&x});
  LOOM_OPS_ON_CUDA(device, scale_(x, factor))
  require_cpu_f32("scale_", {&x});
  cpu::scale_inplace(x.f32(), factor, x.numel());
}

void round_to_bf16_(const Tensor& x) {
  if (x.dtype() == DType::BF16) return;  // holds bf16 values already
  const Device device = device_of("round_to_bf16_", {&x});
  LOOM_OPS_ON_CUDA(device, round_to_bf16_(x))
  cpu::round_to_bf16_inplace(x.f32(), x.numel());
}

}  // namespace loom::ops
