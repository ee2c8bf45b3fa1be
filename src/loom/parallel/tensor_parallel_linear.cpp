#include "loom/parallel/tensor_parallel_linear.hpp"

#include <numeric>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"
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

// Weight (and bias) gradients accumulated from columns [d_out_col, ...) of d_out: the part of
// Linear's backward that needs the input.
void parameter_gradients(Linear& linear, const Tensor& d_out, int64_t d_out_col,
                         const Tensor& input) {
  linear.weight_grad(d_out, d_out_col, input, true);
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

namespace {
// The group, SP setting and input width the layers share, checked.
const ColumnParallelLinear& first_of(const std::vector<ColumnParallelLinear*>& layers) {
  if (layers.empty()) throw_error("column-parallel pass over no layers");
  const ColumnParallelLinear& first = *layers.front();
  for (const ColumnParallelLinear* layer : layers)
    if (&layer->group() != &first.group() ||
        layer->sequence_parallel() != first.sequence_parallel() ||
        layer->in_features() != first.in_features())
      throw_error(
          "column-parallel layers read one input: they must share the group, sequence parallelism "
          "and "
          "in_features");
  return first;
}
}  // namespace

namespace {

void forward_columns(const std::vector<ColumnParallelLinear*>& layers, const Tensor& out,
                     int64_t out_col, const Tensor& input, ColumnParallelLinear::Scratch& scratch) {
  const ColumnParallelLinear& first = first_of(layers);
  ProcessGroup& group = first.group();
  const int tp = group.size();
  const int64_t rows = out.size(0), in = first.in_features();
  Tensor full = input;
  if (first.sequence_parallel() && tp > 1) {
    (void)sequence_shard_rows(column_layer(first.name()), rows, tp);
    full = reserve_like(scratch.gathered_input, rows, in, input);
    gather_sequence_rows(group, input, full)->wait();
  }
  int64_t column = out_col;
  for (ColumnParallelLinear* layer : layers) {
    layer->local.forward(out, column, full);
    column += layer->local_out_features();
  }
}

void backward_columns(const std::vector<ColumnParallelLinear*>& layers, const Tensor& d_input,
                      bool accumulate_input, const Tensor& d_out, int64_t d_out_col,
                      const Tensor& input, ColumnParallelLinear::Scratch& scratch) {
  const ColumnParallelLinear& first = first_of(layers);
  ProcessGroup& group = first.group();
  const int tp = group.size();
  const int64_t rows = d_out.size(0), in = first.in_features();
  const bool sequence_parallel = first.sequence_parallel() && tp > 1;
  auto input_gradients = [&](const Tensor& partial) {
    int64_t column = d_out_col;
    for (size_t i = 0; i < layers.size(); ++i) {
      layers[i]->local.input_grad(partial, i > 0, d_out, column);
      column += layers[i]->local_out_features();
    }
  };
  auto parameter_gradients_of_all = [&](const Tensor& full_input) {
    int64_t column = d_out_col;
    for (ColumnParallelLinear* layer : layers) {
      parameter_gradients(layer->local, d_out, column, full_input);
      column += layer->local_out_features();
    }
  };
  if (!sequence_parallel) {
    // Every rank's d_input is its share of the sum; it can be reduced in place unless there
    // is an earlier value to add to, which must not be summed tp times.
    const Tensor partial =
        accumulate_input ? reserve_like(scratch.d_input_partial, rows, in, d_input) : d_input;
    input_gradients(partial);
    WorkHandle reduce = comm::all_reduce(group, partial, ReduceOp::Sum);
    parameter_gradients_of_all(input);
    reduce->wait();
    if (accumulate_input) ops::add_into(d_input, partial);
    return;
  }
  const int64_t local_rows = sequence_shard_rows(column_layer(first.name()), rows, tp);
  const Tensor gathered = reserve_like(scratch.gathered_input, rows, in, input);
  WorkHandle gather = gather_sequence_rows(group, input, gathered);
  const Tensor partial = reserve_like(scratch.d_input_partial, rows, in, d_input);
  input_gradients(partial);
  // To accumulate, this rank adds its earlier d_input into its own block of the sum, so the
  // reduce-scatter can write straight into d_input (it appears in exactly one rank's terms).
  if (accumulate_input)
    ops::add_into(partial.narrow_rows(group.rank() * local_rows, (group.rank() + 1) * local_rows),
                  d_input);
  WorkHandle reduce = reduce_scatter_sequence_rows(group, partial, d_input);
  gather->wait();
  parameter_gradients_of_all(gathered);
  reduce->wait();
}

}  // namespace

void ColumnParallelLinear::forward(const Tensor& out, int64_t out_col, const Tensor& input) {
  forward_columns({this}, out, out_col, input, scratch_);
}

void ColumnParallelLinear::backward(const Tensor& d_input, bool accumulate_input,
                                    const Tensor& d_out, int64_t d_out_col, const Tensor& input) {
  backward_columns({this}, d_input, accumulate_input, d_out, d_out_col, input, scratch_);
}

void column_parallel_forward(const std::vector<ColumnParallelLinear*>& layers, const Tensor& out,
                             const Tensor& input, ColumnParallelLinear::Scratch& scratch) {
  forward_columns(layers, out, 0, input, scratch);
}

void column_parallel_backward(const std::vector<ColumnParallelLinear*>& layers,
                              const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                              int64_t d_out_col, const Tensor& input,
                              ColumnParallelLinear::Scratch& scratch) {
  backward_columns(layers, d_input, accumulate_input, d_out, d_out_col, input, scratch);
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
  local.weight.placement =
      shard_placement({out_features, in_features}, 1, group_->rank(), group_->size());
}

void RowParallelLinear::forward(const Tensor& out, const Tensor& input) {
  const int tp = group_->size();
  const int64_t rows = input.size(0), width = out_features();
  // The partial products carry no bias: added before the sum it would count tp times.
  if (!sequence_parallel_ || tp == 1) {
    local.forward_unbiased(out, 0, input);
    comm::all_reduce(*group_, out, ReduceOp::Sum)->wait();
    if (local.has_bias()) ops::add_row_vector(out, local.bias.value);
    return;
  }
  (void)sequence_shard_rows(row_layer(name_), rows, tp);
  const Tensor partial = reserve_like(full_rows_, rows, width, out);
  local.forward_unbiased(partial, 0, input);
  reduce_scatter_sequence_rows(*group_, partial, out)->wait();
  if (local.has_bias()) ops::add_row_vector(out, local.bias.value);
}

void RowParallelLinear::backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                                 const Tensor& input) {
  const int tp = group_->size();
  const int64_t rows = input.size(0), width = out_features();
  if (!sequence_parallel_ || tp == 1) {
    local.backward(d_input, accumulate_input, d_out, 0, input);
    return;
  }
  (void)sequence_shard_rows(row_layer(name_), rows, tp);
  const Tensor gathered = reserve_like(full_rows_, rows, width, d_out);
  WorkHandle gather = gather_sequence_rows(*group_, d_out, gathered);
  if (local.has_bias())  // this rank's rows only; summed over tp later (see the header)
    ops::bias_grad(local.bias.grad, d_out);
  gather->wait();
  local.backward_unbiased(d_input, accumulate_input, gathered, 0, input);
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
