#include <algorithm>
#include <vector>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/activations.hpp"
#include "loom/kernels/cuda/adamw.hpp"
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/attention_cudnn.hpp"
#include "loom/kernels/cuda/cross_entropy.hpp"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/embedding.hpp"
#include "loom/kernels/cuda/gemm.hpp"
#include "loom/kernels/cuda/norms.hpp"
#include "loom/kernels/cuda/ops_cuda.hpp"
#include "loom/kernels/cuda/ops_cuda_common.cuh"
#include "loom/kernels/cuda/rope.hpp"
#include "loom/kernels/cuda/vocab_shard.hpp"

namespace loom::ops::cuda_impl {

void linear_forward(const Tensor& out, int64_t out_col, const Tensor& input, const Tensor& weight,
                    const Tensor* bias) {
  const int64_t rows = input.size(0), in = weight.size(1), n_out = weight.size(0), ld = out.size(1);
  if (is_bf16("linear_forward", {&out, &input, &weight, bias}))
    cuda::linear_forward(b16(out) + out_col, ld, b16(input), b16(weight), b16(bias), rows, in,
                         n_out);
  else
    cuda::linear_forward(f32(out) + out_col, ld, f32(input), f32(weight), f32(bias), rows, in,
                         n_out);
}

void linear_backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                     const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                     const Tensor& input, const Tensor& weight) {
  const int64_t rows = input.size(0), in = weight.size(1), n_out = weight.size(0),
                ld = d_out.size(1);
  if (is_bf16("linear_backward", {&d_input, &d_out, &input, &weight}))
    cuda::linear_backward(b16(d_input), accumulate_input, f32(d_weight), f32(d_bias),
                          b16(d_out) + d_out_col, ld, b16(input), b16(weight), rows, in, n_out);
  else
    cuda::linear_backward(f32(d_input), accumulate_input, f32(d_weight), f32(d_bias),
                          f32(d_out) + d_out_col, ld, f32(input), f32(weight), rows, in, n_out);
}

bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& input,
                         const Tensor& weight, const Tensor* bias) {
  if (!is_bf16("linear_gelu_forward", {&act, &pre, &input, &weight, bias})) return false;
  return cuda::linear_gelu_forward(b16(act), b16(pre), pre.size(1), b16(input), b16(weight),
                                   b16(bias), input.size(0), weight.size(1), weight.size(0));
}

bool linear_backward_through_gelu(const Tensor& d_pre, const Tensor& d_weight, const Tensor& d_bias,
                                  const Tensor& d_out, const Tensor& input, const Tensor& weight,
                                  const Tensor& pre) {
  if (!is_bf16("linear_backward_through_gelu", {&d_pre, &d_out, &input, &weight, &pre}))
    return false;
  if (!cuda::gelu_input_grad(b16(d_pre), d_pre.size(1), b16(d_out), d_out.size(1), b16(weight),
                             b16(pre), input.size(0), weight.size(1), weight.size(0)))
    return false;
  // The weight and bias gradients as linear_backward takes them (deferred under a split
  // backward): through the op layer, not the kernel.
  ops::linear_backward(Tensor(), false, d_weight, d_bias, d_out, 0, input, weight);
  return true;
}

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& input, const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t dim = weight.numel(), rows = input.numel() / dim;
  if (is_bf16("layernorm_forward", {&out, &input, &weight, &bias}))
    cuda::layernorm_forward(b16(out), f32(mean), f32(rstd), b16(input), b16(weight), b16(bias),
                            rows, dim, eps);
  else
    cuda::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(input), f32(weight), f32(bias),
                            rows, dim, eps);
}

void layernorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_bias,
                        const Tensor& d_out, const Tensor& input, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t dim = weight.numel(), rows = input.numel() / dim;
  if (is_bf16("layernorm_backward", {&d_input, &d_out, &input, &weight}))
    cuda::layernorm_backward(b16(d_input), f32(d_weight), f32(d_bias), b16(d_out), b16(input),
                             b16(weight), f32(mean), f32(rstd), rows, dim);
  else
    cuda::layernorm_backward(f32(d_input), f32(d_weight), f32(d_bias), f32(d_out), f32(input),
                             f32(weight), f32(mean), f32(rstd), rows, dim);
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& input,
                     const Tensor& weight, float eps) {
  const int64_t dim = weight.numel(), rows = input.numel() / dim;
  if (is_bf16("rmsnorm_forward", {&out, &input, &weight}))
    cuda::rmsnorm_forward(b16(out), f32(rstd), b16(input), b16(weight), rows, dim, eps);
  else
    cuda::rmsnorm_forward(f32(out), f32(rstd), f32(input), f32(weight), rows, dim, eps);
}

void rmsnorm_backward(const Tensor& d_input, const Tensor& d_weight, const Tensor& d_out,
                      const Tensor& input, const Tensor& weight, const Tensor& rstd) {
  const int64_t dim = weight.numel(), rows = input.numel() / dim;
  if (is_bf16("rmsnorm_backward", {&d_input, &d_out, &input, &weight}))
    cuda::rmsnorm_backward(b16(d_input), f32(d_weight), b16(d_out), b16(input), b16(weight),
                           f32(rstd), rows, dim);
  else
    cuda::rmsnorm_backward(f32(d_input), f32(d_weight), f32(d_out), f32(input), f32(weight),
                           f32(rstd), rows, dim);
}

void gelu_forward(const Tensor& out, const Tensor& input) {
  if (is_bf16("gelu_forward", {&out, &input}))
    cuda::gelu_forward(b16(out), b16(input), input.numel());
  else
    cuda::gelu_forward(f32(out), f32(input), input.numel());
}

void gelu_backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input) {
  if (is_bf16("gelu_backward", {&d_input, &d_out, &input}))
    cuda::gelu_backward(b16(d_input), b16(d_out), b16(input), input.numel());
  else
    cuda::gelu_backward(f32(d_input), f32(d_out), f32(input), input.numel());
}

void swiglu_forward(const Tensor& out, const Tensor& fused) {
  const int64_t rows = out.size(0), dim = out.size(1);
  if (is_bf16("swiglu_forward", {&out, &fused}))
    cuda::swiglu_forward(b16(out), b16(fused), b16(fused) + dim, rows, dim, 2 * dim);
  else
    cuda::swiglu_forward(f32(out), f32(fused), f32(fused) + dim, rows, dim, 2 * dim);
}

void swiglu_backward(const Tensor& d_fused, const Tensor& d_out, const Tensor& fused) {
  const int64_t rows = d_out.size(0), dim = d_out.size(1);
  if (is_bf16("swiglu_backward", {&d_fused, &d_out, &fused}))
    cuda::swiglu_backward(b16(d_fused), b16(d_fused) + dim, b16(d_out), b16(fused),
                          b16(fused) + dim, rows, dim, 2 * dim);
  else
    cuda::swiglu_backward(f32(d_fused), f32(d_fused) + dim, f32(d_out), f32(fused),
                          f32(fused) + dim, rows, dim, 2 * dim);
}

std::shared_ptr<void> upload_rope_table(const cpu::RopeTable& table) {
  return std::make_shared<cuda::RopeTableDevice>(table);
}

void rope_apply(const Tensor& x, int64_t batch, int64_t seq_len, int64_t heads,
                const void* device_table, bool inverse, const int32_t* positions) {
  const auto& table = *static_cast<const cuda::RopeTableDevice*>(device_table);
  const DeviceIds ids(positions, batch * seq_len);
  if (x.dtype() == DType::BF16)
    cuda::rope_apply(b16(x), batch, seq_len, heads, x.size(1), table, inverse, ids.get());
  else
    cuda::rope_apply(f32(x), batch, seq_len, heads, x.size(1), table, inverse, ids.get());
}

void embedding_forward(const Tensor& out, const int32_t* tokens, const Tensor& token_table,
                       const Tensor* position_table, int64_t batch, int64_t seq_len,
                       const int32_t* positions) {
  const DeviceIds ids(tokens, batch * seq_len), position_ids(positions, batch * seq_len);
  const int64_t dim = token_table.size(1);
  if (is_bf16("embedding_forward", {&out, &token_table, position_table}))
    cuda::embedding_forward(b16(out), ids.get(), b16(token_table), b16(position_table), batch,
                            seq_len, dim, position_ids.get());
  else
    cuda::embedding_forward(f32(out), ids.get(), f32(token_table), f32(position_table), batch,
                            seq_len, dim, position_ids.get());
}

void embedding_backward(const Tensor& d_token_table, const Tensor* d_position_table,
                        const Tensor& d_out, const int32_t* tokens, int64_t batch, int64_t seq_len,
                        const int32_t* positions) {
  const DeviceIds ids(tokens, batch * seq_len), position_ids(positions, batch * seq_len);
  const int64_t dim = d_out.numel() / (batch * seq_len);
  if (d_out.dtype() == DType::BF16)
    cuda::embedding_backward(f32(d_token_table), f32(d_position_table), b16(d_out), ids.get(),
                             batch, seq_len, dim, position_ids.get());
  else
    cuda::embedding_backward(f32(d_token_table), f32(d_position_table), f32(d_out), ids.get(),
                             batch, seq_len, dim, position_ids.get());
}

namespace {
// The device call's arguments in element type T (float or bf16) from the op's tensors.
template <typename T, typename Pointer>
double head_loss(const CrossEntropyArgs& args, const int32_t* targets, Pointer pointer) {
  cuda::CrossEntropyArgsT<T> a;
  a.hidden = pointer(args.hidden);
  a.weight = pointer(args.weight);
  a.targets = targets;
  a.rows = args.hidden.size(0);
  a.dim = args.hidden.size(1);
  a.vocab = args.weight.size(0);
  a.vocab_chunk = args.vocab_chunk;
  a.grad_scale = args.grad_scale;
  a.d_hidden = pointer(args.d_hidden);
  a.d_weight = f32(args.d_weight);
  a.loss_sum = args.loss_sum;
  return cuda::lm_head_cross_entropy(a);
}
}  // namespace

double lm_head_cross_entropy(const CrossEntropyArgs& args) {
  const DeviceIds targets(args.targets, args.hidden.size(0));
  if (is_bf16("lm_head_cross_entropy", {&args.hidden, &args.weight, &args.d_hidden}))
    return head_loss<bf16>(args, targets.get(), [](const Tensor& t) { return b16(t); });
  return head_loss<float>(args, targets.get(), [](const Tensor& t) { return f32(t); });
}

bool add_norm_forward(const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                      const Tensor& residual, const Tensor& delta, const Tensor& weight,
                      const Tensor& bias, float eps) {
  if (!is_bf16("add_norm_forward", {&sum, &out, &residual, &delta, &weight})) return false;
  const int64_t dim = weight.numel(), rows = sum.numel() / dim;
  if (bias.defined())
    cuda::add_layernorm_forward(b16(sum), b16(out), f32(mean), f32(rstd), b16(residual), b16(delta),
                                b16(weight), b16(bias), rows, dim, eps);
  else
    cuda::add_rmsnorm_forward(b16(sum), b16(out), f32(rstd), b16(residual), b16(delta), b16(weight),
                              rows, dim, eps);
  return true;
}

void add_into(const Tensor& dst, const Tensor& src) {
  if (is_bf16("add_into", {&dst, &src}))
    cuda::add_into(b16(dst), b16(src), dst.numel());
  else
    cuda::add_into(f32(dst), f32(src), dst.numel());
}

void scale_(const Tensor& x, float factor) {
  if (x.dtype() == DType::BF16)
    cuda::scale_inplace(b16(x), factor, x.numel());
  else
    cuda::scale_inplace(f32(x), factor, x.numel());
}

double sum_of_squares(const Tensor& x) {
  if (x.dtype() != DType::F32)
    throw_error("ops::sum_of_squares (cuda): takes F32 tensors (gradients), got ",
                dtype_name(x.dtype()));
  return cuda::sum_of_squares(f32(x), x.numel());
}

std::vector<double> sums_of_squares(const std::vector<const Tensor*>& xs) {
  std::vector<const float*> pointers;
  std::vector<int64_t> sizes;
  for (const Tensor* x : xs) {
    if (x->dtype() != DType::F32)
      throw_error("ops::sums_of_squares (cuda): takes F32 tensors (gradients), got ",
                  dtype_name(x->dtype()));
    pointers.push_back(f32(*x));
    sizes.push_back(x->numel());
  }
  std::vector<double> sums(xs.size());
  cuda::sums_of_squares(sums.data(), pointers.data(), sizes.data(),
                        static_cast<int64_t>(xs.size()));
  return sums;
}

void round_to_bf16_(const Tensor& x) { cuda::round_to_bf16_inplace(f32(x), x.numel()); }

int64_t max_attention_head_dim() { return cuda::kMaxAttentionHeadDim; }

std::string kernel_summary(int64_t head_dim, bool bf16) {
  if (!bf16) return "attention: scalar kernels (f32), logits f32";
  // A causal call of this head width, as cuDNN and the tensor-core kernels judge it (pointers
  // are the engine's, 256-byte aligned, so none is given).
  const cpu::AttentionShape shape{1, 2, 1, 1, head_dim};
  std::string attention;
  switch (cuda::attention_kernel()) {
    case cuda::AttentionKernel::scalar: attention = "scalar kernels"; break;
    case cuda::AttentionKernel::tensor_cores: attention = "loom's first tensor-core kernels"; break;
    case cuda::AttentionKernel::pipelined:
      attention = "loom's pipelined tensor-core kernels";
      break;
    case cuda::AttentionKernel::cudnn: attention = "cuDNN's fused flash attention"; break;
    case cuda::AttentionKernel::automatic: {
      const std::string no_cudnn = cuda::detail::cudnn_attention_refusal(shape, {});
      if (no_cudnn.empty()) {
        attention = "cuDNN's fused flash attention (auto)";
      } else {
        attention = cuda::tensor_cores_refusal(shape, {}).empty()
                        ? "loom's pipelined tensor-core kernels (auto"
                        : "scalar kernels (auto";
        attention += "; cuDNN not taken: " + no_cudnn + ")";
      }
      break;
    }
  }
  return "attention: " + attention + ", logits " + (cuda::bf16_logits() ? "bf16" : "f32");
}

void adamw_update(const Tensor& param, const Tensor& working, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWStep& step) {
  if (!working.defined()) {
    cuda::adamw_update(f32(param), f32(grad), f32(exp_avg), f32(exp_avg_sq), param.numel(), step);
  } else if (working.dtype() == DType::BF16) {
    cuda::adamw_update(f32(param), b16(working), f32(grad), f32(exp_avg), f32(exp_avg_sq),
                       param.numel(), step);
  } else {  // an f32 copy of bf16 values: the CPU's emulation, on the device
    cuda::adamw_update(f32(param), f32(grad), f32(exp_avg), f32(exp_avg_sq), param.numel(), step);
    working.copy_from(param);
    cuda::round_to_bf16_inplace(f32(working), working.numel());
  }
}

void adamw_update_many(std::span<const AdamWTensors> tensors) {
  std::vector<cuda::AdamWTensor> batch;
  batch.reserve(tensors.size());
  for (const AdamWTensors& t : tensors) {
    if (t.working.defined() && t.working.dtype() != DType::BF16) {
      // An f32 working copy (the CPU's bf16 emulation, on the device) takes the single op's
      // separate copy and rounding.
      adamw_update(t.param, t.working, t.grad, t.exp_avg, t.exp_avg_sq, t.step);
      continue;
    }
    batch.push_back({f32(t.param), b16(t.working), f32(t.grad), f32(t.exp_avg), f32(t.exp_avg_sq),
                     t.param.numel(), t.step});
  }
  cuda::adamw_update_many(batch.data(), static_cast<int64_t>(batch.size()));
}

// ---- pieces of tensor-parallel layers ----------------------------------------------------

void linear_input_grad(const Tensor& d_input, bool accumulate, const Tensor& d_out,
                       int64_t d_out_col, const Tensor& weight) {
  const int64_t rows = d_input.size(0), in = weight.size(1), n_out = weight.size(0),
                ld = d_out.size(1);
  if (is_bf16("linear_input_grad", {&d_input, &d_out, &weight}))
    cuda::linear_backward(b16(d_input), accumulate, nullptr, nullptr, b16(d_out) + d_out_col, ld,
                          nullptr, b16(weight), rows, in, n_out);
  else
    cuda::linear_backward(f32(d_input), accumulate, nullptr, nullptr, f32(d_out) + d_out_col, ld,
                          nullptr, f32(weight), rows, in, n_out);
}

void bias_grad(const Tensor& d_bias, const Tensor& d_out) {
  const int64_t rows = d_out.size(0), width = d_out.size(1);
  if (d_out.dtype() == DType::BF16)
    cuda::linear_backward(static_cast<bf16*>(nullptr), false, nullptr, f32(d_bias), b16(d_out),
                          width, nullptr, nullptr, rows, 0, width);
  else
    cuda::linear_backward(static_cast<float*>(nullptr), false, nullptr, f32(d_bias), f32(d_out),
                          width, nullptr, nullptr, rows, 0, width);
}

void add_row_vector(const Tensor& out, const Tensor& v) {
  if (is_bf16("add_row_vector", {&out, &v}))
    cuda::add_row_vector(b16(out), b16(v), out.size(0), out.size(1));
  else
    cuda::add_row_vector(f32(out), f32(v), out.size(0), out.size(1));
}

void embedding_shard_forward(const Tensor& out, const int32_t* tokens, const Tensor& table,
                             int64_t vocab_begin) {
  const int64_t dim = table.size(1), rows = out.numel() / dim;
  const DeviceIds ids(tokens, rows);
  const int64_t end = vocab_begin + table.size(0);
  if (is_bf16("embedding_shard_forward", {&out, &table}))
    cuda::embedding_shard_forward(b16(out), ids.get(), b16(table), rows, dim, vocab_begin, end);
  else
    cuda::embedding_shard_forward(f32(out), ids.get(), f32(table), rows, dim, vocab_begin, end);
}

void embedding_shard_backward(const Tensor& d_table, const Tensor& d_out, const int32_t* tokens,
                              int64_t vocab_begin) {
  const int64_t dim = d_table.size(1), rows = d_out.numel() / dim;
  const DeviceIds ids(tokens, rows);
  const int64_t end = vocab_begin + d_table.size(0);
  if (d_out.dtype() == DType::BF16)
    cuda::embedding_shard_backward(f32(d_table), b16(d_out), ids.get(), rows, dim, vocab_begin, end);
  else
    cuda::embedding_shard_backward(f32(d_table), f32(d_out), ids.get(), rows, dim, vocab_begin, end);
}

void add_position_rows(const Tensor& out, const Tensor& table, int64_t first_row, int64_t seq_len,
                       const int32_t* positions) {
  const int64_t dim = table.size(1), rows = out.numel() / dim;
  const DeviceIds ids(positions, rows);
  if (is_bf16("add_position_rows", {&out, &table}))
    cuda::add_position_rows(b16(out), b16(table), rows, dim, first_row, seq_len, ids.get());
  else
    cuda::add_position_rows(f32(out), f32(table), rows, dim, first_row, seq_len, ids.get());
}

void position_rows_backward(const Tensor& d_table, const Tensor& d_out, int64_t first_row,
                            int64_t seq_len, const int32_t* positions) {
  const int64_t dim = d_table.size(1), rows = d_out.numel() / dim;
  const DeviceIds ids(positions, rows);
  if (d_out.dtype() == DType::BF16)
    cuda::position_rows_backward(f32(d_table), b16(d_out), rows, dim, first_row, seq_len,
                                 ids.get());
  else
    cuda::position_rows_backward(f32(d_table), f32(d_out), rows, dim, first_row, seq_len,
                                 ids.get());
}

namespace {
template <typename T, typename Pointer>
cuda::ShardLogitsT<T> shard_args(const ShardLogitsArgs& args, const int32_t* targets,
                                 Pointer pointer) {
  cuda::ShardLogitsT<T> a;
  a.hidden = pointer(args.hidden);
  a.weight = pointer(args.weight);
  a.targets = targets;
  a.rows = args.hidden.size(0);
  a.dim = args.hidden.size(1);
  a.shard = args.weight.size(0);
  a.vocab_begin = args.vocab_begin;
  a.chunk = std::max<int64_t>(std::min(args.vocab_chunk, a.shard), 1);
  a.logits = f32(args.workspace);
  return a;
}
}  // namespace

void shard_logit_stats(const ShardLogitsArgs& args, const Tensor& stats) {
  const int64_t rows = args.hidden.size(0);
  const DeviceIds targets(args.targets, rows);
  float* s = f32(stats);
  if (is_bf16("shard_logit_stats", {&args.hidden, &args.weight}))
    cuda::shard_logit_stats(shard_args<bf16>(args, targets.get(), [](const Tensor& t) { return b16(t); }),
                            s, s + rows, s + 2 * rows);
  else
    cuda::shard_logit_stats(
        shard_args<float>(args, targets.get(), [](const Tensor& t) { return f32(t); }), s, s + rows,
        s + 2 * rows);
}

void shard_rescale_sums(const Tensor& stats, const Tensor& global_max) {
  const int64_t rows = global_max.numel();
  cuda::rescale_row_sums(f32(stats) + rows, f32(stats), f32(global_max), rows);
}

double shard_loss(const Tensor& lse, const Tensor& stats, const Tensor& global_max,
                  const int32_t* targets, float* row_losses, double* loss_sum) {
  const int64_t rows = lse.numel();
  if (rows == 0) return 0.0;
  const DeviceIds ids(targets, rows);
  Tensor losses;  // the rows' losses on the device, for a host row_losses
  if (row_losses) losses = Tensor::empty({rows}, DType::F32, MemCategory::Workspace, Device::CUDA);
  Tensor total;  // one double (two f32 elements) when the sum comes back to the host
  double* slot = loss_sum;
  if (!slot) {
    total = Tensor::empty({2}, DType::F32, MemCategory::Workspace, Device::CUDA);
    slot = static_cast<double*>(total.raw());
  }
  cuda::log_sum_exp_loss(slot, loss_sum != nullptr, f32(lse), f32(losses), f32(global_max),
                         f32(stats) + rows, f32(stats) + 2 * rows, ids.get(), rows);
  if (row_losses)  // waits for the stream
    device_memory::copy(row_losses, Device::CPU, losses.raw(), Device::CUDA,
                        static_cast<size_t>(rows) * sizeof(float));
  if (loss_sum) return 0.0;
  double value = 0.0;
  device_memory::copy(&value, Device::CPU, slot, Device::CUDA, sizeof value);
  return value;
}

void shard_logit_grad(const ShardLogitsArgs& args, const Tensor& lse, float grad_scale,
                      const Tensor& d_hidden, const Tensor& d_weight) {
  const int64_t rows = args.hidden.size(0);
  const DeviceIds targets(args.targets, rows);
  if (is_bf16("shard_logit_grad", {&args.hidden, &args.weight, &d_hidden}))
    cuda::shard_logit_grad(
        shard_args<bf16>(args, targets.get(), [](const Tensor& t) { return b16(t); }), f32(lse),
        grad_scale, b16(d_hidden), f32(d_weight));
  else
    cuda::shard_logit_grad(
        shard_args<float>(args, targets.get(), [](const Tensor& t) { return f32(t); }), f32(lse),
        grad_scale, f32(d_hidden), f32(d_weight));
}

}  // namespace loom::ops::cuda_impl
