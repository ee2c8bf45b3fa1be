#include "loom/parallel/tensor_parallel_linear.hpp"

#include <numeric>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/parallel/tensor_parallel.hpp"

namespace loom {
namespace {

std::string column_layer(const std::string& name) { return "ColumnParallelLinear '" + name + "'"; }
std::string row_layer(const std::string& name) { return "RowParallelLinear '" + name + "'"; }

// This rank's output width: the sum of every segment's share, each checked on its own.
int64_t local_out_width(const std::string& name, const std::vector<int64_t>& segments, int tp) {
  if (segments.empty()) throw_error(column_layer(name), ": no output segments given");
  int64_t width = 0;
  for (size_t s = 0; s < segments.size(); ++s)
    width += tp_shard_size(column_layer(name),
                           segments.size() == 1 ? std::string("out_features")
                                                : "out_features segment " + std::to_string(s),
                           segments[s], tp);
  return width;
}

void check_full_shape(const std::string& layer, const char* what, const Tensor& full,
                      const Shape& expected) {
  if (full.shape() != expected)
    throw_error(layer, ": full ", what, " is ", shape_to_string(full.shape()), ", expected ",
                shape_to_string(expected));
}

void check_bias_presence(const std::string& layer, const Linear& local, const Tensor* full_bias) {
  if (local.has_bias() != (full_bias != nullptr))
    throw_error(layer, local.has_bias() ? ": has a bias but none was given"
                                        : ": has no bias but one was given");
}

// d_input = d_out @ W, written or (accumulate) added: the part of Linear's backward that
// needs no input.
void input_gradient(float* d_input, bool accumulate, const float* d_out, int64_t d_out_ld, const Linear& linear,
                    int64_t rows) {
  cpu::sgemm(false, false, rows, linear.in_features(), linear.out_features(), 1.0f, d_out, d_out_ld,
             linear.weight.value.f32(), linear.in_features(), accumulate ? 1.0f : 0.0f, d_input,
             linear.in_features());
}

// Weight (and bias) gradients accumulated: the part of Linear's backward that needs the input.
void parameter_gradients(Linear& linear, const float* d_out, int64_t d_out_ld, const float* input,
                         int64_t rows) {
  cpu::linear_backward(nullptr, false, linear.weight.grad.f32(),
                       linear.has_bias() ? linear.bias.grad.f32() : nullptr, d_out, d_out_ld, input,
                       linear.weight.value.f32(), rows, linear.in_features(),
                       linear.out_features());
}

void add_inplace(float* dst, const float* src, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
}

void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) out[r * width + j] += bias[j];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ColumnParallelLinear

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in_features,
                                           int64_t out_features, bool bias,
                                           std::shared_ptr<ProcessGroup> group,
                                           bool sequence_parallel, bool hf_transposed)
    : ColumnParallelLinear(std::move(name), in_features, std::vector<int64_t>{out_features}, bias,
                           std::move(group), sequence_parallel, hf_transposed) {}

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in_features,
                                           std::vector<int64_t> out_segments, bool bias,
                                           std::shared_ptr<ProcessGroup> group,
                                           bool sequence_parallel, bool hf_transposed)
    : local(name, in_features, local_out_width(name, out_segments, group->size()), bias,
            hf_transposed),
      name_(std::move(name)),
      out_segments_(std::move(out_segments)),
      group_(std::move(group)),
      sequence_parallel_(sequence_parallel) {
  const int rank = group_->rank(), tp = group_->size();
  const int64_t out = std::accumulate(out_segments_.begin(), out_segments_.end(), int64_t{0});
  local.weight.placement = shard_placement({out, in_features}, 0, rank, tp, out_segments_);
  if (local.has_bias()) local.bias.placement = shard_placement({out}, 0, rank, tp, out_segments_);
}

void ColumnParallelLinear::forward(float* out, int64_t out_ld, const float* input, int64_t rows) {
  column_parallel_forward({this}, out, out_ld, input, rows, scratch_);
}

void ColumnParallelLinear::backward(float* d_input, bool accumulate_input, const float* d_out,
                                    int64_t d_out_ld, const float* input, int64_t rows) {
  column_parallel_backward({this}, d_input, accumulate_input, d_out, d_out_ld, input, rows, scratch_);
}

namespace {
// The group, SP setting and input width the layers share, checked.
const ColumnParallelLinear& first_of(const std::vector<ColumnParallelLinear*>& layers) {
  if (layers.empty()) throw_error("column-parallel pass over no layers");
  const ColumnParallelLinear& first = *layers.front();
  for (const ColumnParallelLinear* layer : layers)
    if (&layer->group() != &first.group() || layer->sequence_parallel() != first.sequence_parallel() ||
        layer->in_features() != first.in_features())
      throw_error("column-parallel layers read one input: they must share the group, sequence parallelism and "
                  "in_features");
  return first;
}
}  // namespace

void column_parallel_forward(const std::vector<ColumnParallelLinear*>& layers, float* out, int64_t out_ld,
                             const float* input, int64_t rows, ColumnParallelLinear::Scratch& scratch) {
  const ColumnParallelLinear& first = first_of(layers);
  ProcessGroup& group = first.group();
  const int tp = group.size();
  const int64_t in = first.in_features();
  const float* full = input;
  if (first.sequence_parallel() && tp > 1) {
    float* gathered = reserve_f32(scratch.gathered_input, rows * in, MemCategory::Workspace);
    gather_sequence_rows(group, input, gathered, sequence_shard_rows(column_layer(first.name()), rows, tp), in)->wait();
    full = gathered;
  }
  int64_t column = 0;
  for (ColumnParallelLinear* layer : layers) {
    const Linear& local = layer->local;
    cpu::linear_forward(out + column, out_ld, full, local.weight.value.f32(),
                        local.has_bias() ? local.bias.value.f32() : nullptr, rows,
                        local.in_features(), local.out_features());
    column += layer->local_out_features();
  }
}

void column_parallel_backward(const std::vector<ColumnParallelLinear*>& layers, float* d_input,
                              bool accumulate_input, const float* d_out, int64_t d_out_ld, const float* input,
                              int64_t rows, ColumnParallelLinear::Scratch& scratch) {
  const ColumnParallelLinear& first = first_of(layers);
  ProcessGroup& group = first.group();
  const int tp = group.size();
  const int64_t in = first.in_features();
  const bool sequence_parallel = first.sequence_parallel() && tp > 1;
  auto input_gradients = [&](float* partial) {
    int64_t column = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      input_gradient(partial, i > 0, d_out + column, d_out_ld, layers[i]->local, rows);
      column += layers[i]->local_out_features();
    }
  };
  auto parameter_gradients_of_all = [&](const float* full_input) {
    int64_t column = 0;
    for (ColumnParallelLinear* layer : layers) {
      parameter_gradients(layer->local, d_out + column, d_out_ld, full_input, rows);
      column += layer->local_out_features();
    }
  };
  if (!sequence_parallel) {
    // Every rank's d_input is its share of the sum; it can be reduced in place unless there
    // is an earlier value to add to, which must not be summed tp times.
    float* partial =
        accumulate_input ? reserve_f32(scratch.d_input_partial, rows * in, MemCategory::Workspace) : d_input;
    input_gradients(partial);
    WorkHandle reduce = group.all_reduce(partial, rows * in, ReduceOp::Sum);
    parameter_gradients_of_all(input);
    reduce->wait();
    if (accumulate_input) add_inplace(d_input, partial, rows * in);
    return;
  }
  const int64_t local_rows = sequence_shard_rows(column_layer(first.name()), rows, tp);
  float* gathered = reserve_f32(scratch.gathered_input, rows * in, MemCategory::Workspace);
  WorkHandle gather = gather_sequence_rows(group, input, gathered, local_rows, in);
  float* partial = reserve_f32(scratch.d_input_partial, rows * in, MemCategory::Workspace);
  input_gradients(partial);
  // To accumulate, this rank adds its earlier d_input into its own block of the sum, so the
  // reduce-scatter can write straight into d_input (it appears in exactly one rank's terms).
  if (accumulate_input) add_inplace(partial + group.rank() * local_rows * in, d_input, local_rows * in);
  WorkHandle reduce = reduce_scatter_sequence_rows(group, partial, d_input, local_rows, in);
  gather->wait();
  parameter_gradients_of_all(gathered);
  reduce->wait();
}

void ColumnParallelLinear::load_full(const Tensor& full_weight, const Tensor* full_bias) {
  const int64_t out = std::accumulate(out_segments_.begin(), out_segments_.end(), int64_t{0});
  check_full_shape(column_layer(name_), "weight", full_weight, {out, in_features()});
  check_bias_presence(column_layer(name_), local, full_bias);
  local.weight.value.copy_from(row_shard(full_weight, group_->rank(), group_->size(), out_segments_,
                                         MemCategory::Workspace));
  if (full_bias) {
    check_full_shape(column_layer(name_), "bias", *full_bias, {out});
    local.bias.value.copy_from(row_shard(*full_bias, group_->rank(), group_->size(), out_segments_,
                                         MemCategory::Workspace));
  }
}

// ---------------------------------------------------------------------------------------------
// RowParallelLinear

RowParallelLinear::RowParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                                     bool bias, std::shared_ptr<ProcessGroup> group,
                                     bool sequence_parallel, bool hf_transposed)
    : local(name, tp_shard_size(row_layer(name), "in_features", in_features, group->size()),
            out_features, bias, hf_transposed),
      name_(std::move(name)),
      group_(std::move(group)),
      sequence_parallel_(sequence_parallel) {
  local.weight.placement = shard_placement({out_features, in_features}, 1, group_->rank(),
                                           group_->size());
}

void RowParallelLinear::forward(float* out, const float* input, int64_t rows) {
  const int tp = group_->size();
  const int64_t in = local_in_features(), width = out_features();
  const float* bias = local.has_bias() ? local.bias.value.f32() : nullptr;
  // The partial products carry no bias: added before the sum it would count tp times.
  if (!sequence_parallel_ || tp == 1) {
    cpu::linear_forward(out, width, input, local.weight.value.f32(), nullptr, rows, in, width);
    group_->all_reduce(out, rows * width, ReduceOp::Sum)->wait();
    if (bias) add_bias_rows(out, bias, rows, width);
    return;
  }
  const int64_t local_rows = sequence_shard_rows(row_layer(name_), rows, tp);
  float* partial = reserve_f32(full_rows_, rows * width, MemCategory::Workspace);
  cpu::linear_forward(partial, width, input, local.weight.value.f32(), nullptr, rows, in, width);
  reduce_scatter_sequence_rows(*group_, partial, out, local_rows, width)->wait();
  if (bias) add_bias_rows(out, bias, local_rows, width);
}

void RowParallelLinear::backward(float* d_input, bool accumulate_input, const float* d_out,
                                 const float* input, int64_t rows) {
  const int tp = group_->size();
  const int64_t width = out_features();
  if (!sequence_parallel_ || tp == 1) {
    cpu::linear_backward(d_input, accumulate_input, local.weight.grad.f32(),
                         local.has_bias() ? local.bias.grad.f32() : nullptr, d_out, width, input,
                         local.weight.value.f32(), rows, local_in_features(), width);
    return;
  }
  const int64_t local_rows = sequence_shard_rows(row_layer(name_), rows, tp);
  float* gathered = reserve_f32(full_rows_, rows * width, MemCategory::Workspace);
  WorkHandle gather = gather_sequence_rows(*group_, d_out, gathered, local_rows, width);
  if (local.has_bias())  // this rank's rows only; summed over tp later (see the header)
    cpu::linear_backward(nullptr, false, nullptr, local.bias.grad.f32(), d_out, width, nullptr,
                         nullptr, local_rows, local_in_features(), width);
  gather->wait();
  cpu::linear_backward(d_input, accumulate_input, local.weight.grad.f32(), nullptr, gathered, width,
                       input, local.weight.value.f32(), rows, local_in_features(), width);
}

ParameterList RowParallelLinear::sequence_parallel_partial_grads() {
  if (sequence_parallel_ && local.has_bias()) return {&local.bias};
  return {};
}

void RowParallelLinear::load_full(const Tensor& full_weight, const Tensor* full_bias) {
  check_full_shape(row_layer(name_), "weight", full_weight,
                   {out_features(), local_in_features() * group_->size()});
  check_bias_presence(row_layer(name_), local, full_bias);
  local.weight.value.copy_from(
      column_shard(full_weight, group_->rank(), group_->size(), MemCategory::Workspace));
  if (full_bias) {
    check_full_shape(row_layer(name_), "bias", *full_bias, {out_features()});
    local.bias.value.copy_from(*full_bias);
  }
}

}  // namespace loom
