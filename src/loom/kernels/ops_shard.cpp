// ops.hpp's pieces of tensor-parallel layers: checks, then the CPU kernels (kernels/cpu/
// vocab_shard, gemm) or the CUDA implementation.
#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/gemm.hpp"
#include "loom/kernels/cpu/vocab_shard.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/kernels/ops_common.hpp"
#include "loom/kernels/weight_grads.hpp"

namespace loom::ops {

using detail::checked_positions;
using detail::device_of;
using detail::f32_or_null;
using detail::require_2d;
using detail::require_cpu_f32;

void linear_input_grad(const Tensor& d_input, bool accumulate, const Tensor& d_out,
                       int64_t d_out_col, const Tensor& weight) {
  const Device device = device_of("linear_input_grad", {&d_input, &d_out, &weight});
  require_2d("linear_input_grad", "d_input", d_input);
  require_2d("linear_input_grad", "d_out", d_out);
  require_2d("linear_input_grad", "the weight", weight);
  const int64_t rows = d_input.size(0), in = weight.size(1), out = weight.size(0);
  if (d_input.size(1) != in || d_out.size(0) != rows || d_out_col < 0 ||
      d_out_col + out > d_out.size(1))
    throw_error("ops::linear_input_grad: d_input ", shape_to_string(d_input.shape()),
                " from columns [", d_out_col, ", ", d_out_col + out, ") of d_out ",
                shape_to_string(d_out.shape()), " and weight ", shape_to_string(weight.shape()));
  LOOM_OPS_ON_CUDA(device, linear_input_grad(d_input, accumulate, d_out, d_out_col, weight))
  require_cpu_f32("linear_input_grad", {&d_input, &d_out, &weight});
  cpu::sgemm(false, false, rows, in, out, 1.0f, d_out.f32() + d_out_col, d_out.size(1),
             weight.f32(), in, accumulate ? 1.0f : 0.0f, d_input.f32(), in);
}

void bias_grad(const Tensor& d_bias, const Tensor& d_out) {
  const Device device = device_of("bias_grad", {&d_bias, &d_out});
  require_2d("bias_grad", "d_out", d_out);
  if (d_bias.dtype() != DType::F32 || d_bias.numel() != d_out.size(1))
    throw_error("ops::bias_grad: d_bias must be F32 of ", d_out.size(1), " elements, got a ",
                dtype_name(d_bias.dtype()), " ", shape_to_string(d_bias.shape()));
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    later->add([d_bias, kept = later->keep(d_out)] { bias_grad(d_bias, kept); });
    return;
  }
  LOOM_OPS_ON_CUDA(device, bias_grad(d_bias, d_out))
  require_cpu_f32("bias_grad", {&d_out});
  cpu::linear_backward(nullptr, false, nullptr, d_bias.f32(), d_out.f32(), d_out.size(1), nullptr,
                       nullptr, d_out.size(0), 0, d_out.size(1));
}

void add_row_vector(const Tensor& out, const Tensor& v) {
  const Device device = device_of("add_row_vector", {&out, &v});
  require_2d("add_row_vector", "out", out);
  if (v.numel() != out.size(1))
    throw_error("ops::add_row_vector: a vector of ", v.numel(), " for rows of ", out.size(1));
  LOOM_OPS_ON_CUDA(device, add_row_vector(out, v))
  require_cpu_f32("add_row_vector", {&out, &v});
  cpu::add_row_vector(out.f32(), v.f32(), out.size(0), out.size(1));
}

namespace {
void check_rows(const char* op, const Tensor& rows_tensor, const Tensor& table) {
  require_2d(op, "the table", table);
  if (rows_tensor.numel() % table.size(1) != 0)
    throw_error("ops::", op, ": ", shape_to_string(rows_tensor.shape()), " is not rows of ",
                table.size(1));
}
}  // namespace

void embedding_shard_forward(const Tensor& out, const int32_t* tokens, const Tensor& table,
                             int64_t vocab_begin) {
  const Device device = device_of("embedding_shard_forward", {&out, &table});
  check_rows("embedding_shard_forward", out, table);
  LOOM_OPS_ON_CUDA(device, embedding_shard_forward(out, tokens, table, vocab_begin))
  require_cpu_f32("embedding_shard_forward", {&out, &table});
  const int64_t dim = table.size(1);
  cpu::embedding_shard_forward(out.f32(), tokens, table.f32(), out.numel() / dim, dim, vocab_begin,
                               vocab_begin + table.size(0));
}

void embedding_shard_backward(const Tensor& d_table, const Tensor& d_out, const int32_t* tokens,
                              int64_t vocab_begin) {
  const Device device = device_of("embedding_shard_backward", {&d_table, &d_out});
  check_rows("embedding_shard_backward", d_out, d_table);
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    std::vector<int32_t> ids(tokens, tokens + d_out.numel() / d_table.size(1));
    later->add([d_table, kept = later->keep(d_out), ids = std::move(ids), vocab_begin] {
      embedding_shard_backward(d_table, kept, ids.data(), vocab_begin);
    });
    return;
  }
  LOOM_OPS_ON_CUDA(device, embedding_shard_backward(d_table, d_out, tokens, vocab_begin))
  require_cpu_f32("embedding_shard_backward", {&d_table, &d_out});
  const int64_t dim = d_table.size(1);
  cpu::embedding_shard_backward(d_table.f32(), d_out.f32(), tokens, d_out.numel() / dim, dim,
                                vocab_begin, vocab_begin + d_table.size(0));
}

void add_position_rows(const Tensor& out, const Tensor& table, int64_t first_row, int64_t seq_len,
                       std::span<const int32_t> positions) {
  const Device device = device_of("add_position_rows", {&out, &table});
  check_rows("add_position_rows", out, table);
  const int32_t* ids = checked_positions("add_position_rows", positions, first_row,
                                         out.numel() / table.size(1), table.size(0));
  LOOM_CHECK(seq_len > 0 && seq_len <= table.size(0), "ops::add_position_rows: sequence ", seq_len,
             " for a table of ", table.size(0), " positions");
  LOOM_OPS_ON_CUDA(
      device, add_position_rows(out, table, first_row, seq_len, ids ? ids + first_row : nullptr))
  require_cpu_f32("add_position_rows", {&out, &table});
  const int64_t dim = table.size(1);
  cpu::add_position_rows(out.f32(), table.f32(), out.numel() / dim, dim, first_row, seq_len, ids);
}

void position_rows_backward(const Tensor& d_table, const Tensor& d_out, int64_t first_row,
                            int64_t seq_len, std::span<const int32_t> positions) {
  if (DeferredWeightGrads* later = deferring_weight_grads()) {
    later->add([d_table, kept = later->keep(d_out), first_row, seq_len,
                ids = std::vector<int32_t>(positions.begin(), positions.end())] {
      position_rows_backward(d_table, kept, first_row, seq_len, ids);
    });
    return;
  }
  const Device device = device_of("position_rows_backward", {&d_table, &d_out});
  check_rows("position_rows_backward", d_out, d_table);
  const int32_t* ids = checked_positions("position_rows_backward", positions, first_row,
                                         d_out.numel() / d_table.size(1), d_table.size(0));
  LOOM_CHECK(seq_len > 0 && seq_len <= d_table.size(0), "ops::position_rows_backward: sequence ",
             seq_len, " for a table of ", d_table.size(0), " positions");
  LOOM_OPS_ON_CUDA(device, position_rows_backward(d_table, d_out, first_row, seq_len,
                                                  ids ? ids + first_row : nullptr))
  require_cpu_f32("position_rows_backward", {&d_table, &d_out});
  const int64_t dim = d_table.size(1);
  cpu::position_rows_backward(d_table.f32(), d_out.f32(), d_out.numel() / dim, dim, first_row,
                              seq_len, ids);
}

namespace {
// Checks the operands of a shard head pass; returns the chunk width.
int64_t check_shard_logits(const char* op, const ShardLogitsArgs& a) {
  require_2d(op, "hidden", a.hidden);
  require_2d(op, "the head shard", a.weight);
  if (a.hidden.size(1) != a.weight.size(1))
    throw_error("ops::", op, ": hidden ", shape_to_string(a.hidden.shape()), " and head shard ",
                shape_to_string(a.weight.shape()), " differ in width");
  const int64_t chunk = std::max<int64_t>(std::min(a.vocab_chunk, a.weight.size(0)), 1);
  if (!a.workspace.defined() || a.workspace.dtype() != DType::F32 ||
      a.workspace.numel() < a.hidden.size(0) * chunk)
    throw_error("ops::", op, ": the workspace must be F32 of at least ", a.hidden.size(0), " x ",
                chunk, " elements");
  return chunk;
}

cpu::ShardLogits cpu_args(const ShardLogitsArgs& a, int64_t chunk) {
  cpu::ShardLogits c;
  c.hidden = a.hidden.f32();
  c.weight = a.weight.f32();
  c.targets = a.targets;
  c.rows = a.hidden.size(0);
  c.dim = a.hidden.size(1);
  c.shard = a.weight.size(0);
  c.vocab_begin = a.vocab_begin;
  c.chunk = chunk;
  c.logits = a.workspace.f32();
  return c;
}
}  // namespace

namespace {
// stats: F32 [3, rows] on `device`.
void check_stats(const char* op, const Tensor& stats, int64_t rows) {
  if (!stats.defined() || stats.dtype() != DType::F32 || stats.numel() != 3 * rows)
    throw_error("ops::", op, ": the row statistics must be F32 [3, ", rows, "]; got ",
                stats.defined() ? shape_to_string(stats.shape()) : "none");
}
void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows) {
  if (!t.defined() || t.dtype() != DType::F32 || t.numel() != rows)
    throw_error("ops::", op, ": ", name, " must be F32 [", rows, "]; got ",
                t.defined() ? shape_to_string(t.shape()) : "none");
}
}  // namespace

void shard_logit_stats(const ShardLogitsArgs& a, const Tensor& stats) {
  const Device device =
      device_of("shard_logit_stats", {&a.hidden, &a.weight, &a.workspace, &stats});
  const int64_t chunk = check_shard_logits("shard_logit_stats", a);
  const int64_t rows = a.hidden.size(0);
  check_stats("shard_logit_stats", stats, rows);
  LOOM_OPS_ON_CUDA(device, shard_logit_stats(a, stats))
  require_cpu_f32("shard_logit_stats", {&a.hidden, &a.weight});
  float* s = stats.f32();
  std::fill_n(s + 2 * rows, rows, 0.0f);  // the kernel leaves targets it does not own alone
  cpu::shard_logit_stats(cpu_args(a, chunk), s, s + rows, s + 2 * rows);
}

void shard_rescale_sums(const Tensor& stats, const Tensor& global_max) {
  const Device device = device_of("shard_rescale_sums", {&stats, &global_max});
  const int64_t rows = global_max.numel();
  check_stats("shard_rescale_sums", stats, rows);
  check_rows("shard_rescale_sums", "global_max", global_max, rows);
  LOOM_OPS_ON_CUDA(device, shard_rescale_sums(stats, global_max))
  const float* local_max = stats.f32();
  float* sum = stats.f32() + rows;
  const float* gmax = global_max.f32();
  for (int64_t r = 0; r < rows; ++r) sum[r] *= std::exp(local_max[r] - gmax[r]);
}

double shard_loss(const Tensor& lse, const Tensor& stats, const Tensor& global_max,
                  const int32_t* targets, float* row_losses, double* loss_sum) {
  const Device device = device_of("shard_loss", {&lse, &stats, &global_max});
  const int64_t rows = lse.numel();
  check_rows("shard_loss", "lse", lse, rows);
  check_rows("shard_loss", "global_max", global_max, rows);
  check_stats("shard_loss", stats, rows);
  if (!targets) throw_error("ops::shard_loss: no targets");
  LOOM_OPS_ON_CUDA(device, shard_loss(lse, stats, global_max, targets, row_losses, loss_sum))
  const float* gmax = global_max.f32();
  const float* sum = stats.f32() + rows;
  const float* target_logit = stats.f32() + 2 * rows;
  float* l = lse.f32();
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    l[r] = gmax[r] + std::log(sum[r]);
    const float loss = targets[r] >= 0 ? l[r] - target_logit[r] : 0.0f;
    if (row_losses) row_losses[r] = loss;
    total += loss;
  }
  if (!loss_sum) return total;
  *loss_sum += total;
  return 0.0;
}

void shard_logit_grad(const ShardLogitsArgs& a, const Tensor& lse, float grad_scale,
                      const Tensor& d_hidden, const Tensor& d_weight) {
  const Device device = device_of("shard_logit_grad",
                                  {&a.hidden, &a.weight, &a.workspace, &lse, &d_hidden, &d_weight});
  const int64_t chunk = check_shard_logits("shard_logit_grad", a);
  check_rows("shard_logit_grad", "lse", lse, a.hidden.size(0));
  if (d_hidden.defined() && d_hidden.numel() != a.hidden.numel())
    throw_error("ops::shard_logit_grad: d_hidden ", shape_to_string(d_hidden.shape()),
                " for hidden ", shape_to_string(a.hidden.shape()));
  if (d_weight.defined() &&
      (d_weight.numel() != a.weight.numel() || d_weight.dtype() != DType::F32))
    throw_error("ops::shard_logit_grad: d_weight must be F32 shaped like the head shard ",
                shape_to_string(a.weight.shape()));
  LOOM_OPS_ON_CUDA(device, shard_logit_grad(a, lse, grad_scale, d_hidden, d_weight))
  require_cpu_f32("shard_logit_grad", {&a.hidden, &a.weight, &d_hidden, &d_weight});
  cpu::shard_logit_grad(cpu_args(a, chunk), lse.f32(), grad_scale, f32_or_null(d_hidden),
                        f32_or_null(d_weight), true);
}

}  // namespace loom::ops
