#pragma once
// Megatron's two linear layers (Shoeybi et al. 2019, section 3, figure 3), with optional
// sequence parallelism (Korthikanti et al. 2022, section 4.2.2). A column-parallel layer
// followed by a row-parallel one (fc -> GELU -> proj, qkv -> attention -> out) needs one
// all-reduce forward and one backward; under sequence parallelism each all-reduce becomes an
// all-gather plus a reduce-scatter of the same total bytes, and the activations around the
// pair are stored split over tp.
//
//            forward in -> out                       backward d_out -> d_in
//   Column   x (SP: all-gather rows) -> x W_r^T      d_out W_r -> all-reduce (SP: reduce-scatter)
//   Row      x_r W_r^T -> all-reduce (SP: r-s) + b   d_out (SP: all-gather rows) -> d_out W_r
//
// Both hold a plain Linear of their shard, so the kernels, parameter names (the HF name of the
// full tensor) and gradient accumulation are Linear's. Sharded parameters carry
// placement.replicated = false.
#include <memory>
#include <string>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/model/linear.hpp"

namespace loom {

class ColumnParallelLinear {
 public:
  // Full weight [out_features, in_features]; rank r holds rows [r*out/tp, (r+1)*out/tp) and
  // the same slice of the bias.
  ColumnParallelLinear(std::string name, int64_t in_features, int64_t out_features, bool bias,
                       std::shared_ptr<ProcessGroup> group, bool sequence_parallel,
                       bool hf_transposed = false);
  // A fused projection whose output is several tensors side by side (GPT-2's c_attn = q|k|v,
  // a fused gate|up): the full weight is [sum(out_segments), in] and each segment is split over
  // tp on its own, so rank r's output is its slice of segment 0, then of segment 1, ...
  ColumnParallelLinear(std::string name, int64_t in_features, std::vector<int64_t> out_segments,
                       bool bias, std::shared_ptr<ProcessGroup> group, bool sequence_parallel,
                       bool hf_transposed = false);

  // input: [rows, in] (the same on every tp rank), or under sequence parallelism this rank's
  // [rows/tp, in]. out: [rows, *], whose columns [out_col, out_col + out/tp) are written.
  // Tensors of either device; activations F32, or BF16 on CUDA.
  void forward(const Tensor& out, int64_t out_col, const Tensor& input);
  // d_out: columns [d_out_col, + out/tp) of [rows, *]; input as given to forward. d_input,
  // shaped like input, gets the gradient summed over tp, written or added; weight and bias
  // gradients (complete, local) are accumulated. Under sequence parallelism the input is
  // gathered again here rather than kept from forward: keeping it would store [rows, in] per
  // layer instead of [rows/tp, in], the activation memory sequence parallelism exists to
  // save (Korthikanti et al. section 4.2.2 do the same). The gather is issued before the
  // d_input product and the d_input reduction before the weight product, so each can overlap.
  void backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                int64_t d_out_col, const Tensor& input);

  // Copies this rank's shard out of the full weight [out, in] and bias [out] (null if none).
  void load_full(const Tensor& full_weight, const Tensor* full_bias);
  void collect(ParameterList& out) { local.collect(out); }

  const std::string& name() const { return name_; }
  int64_t in_features() const { return local.in_features(); }
  int64_t local_out_features() const { return local.out_features(); }
  const std::vector<int64_t>& out_segments() const { return out_segments_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  ProcessGroup& group() const { return *group_; }

  Linear local;  // [out/tp, in]

  // Buffers a column-parallel pass reuses from call to call.
  struct Scratch {
    Tensor gathered_input;   // [rows, in] under sequence parallelism, rewritten every call
    Tensor d_input_partial;  // [rows, in] unreduced d_input when it cannot go straight to d_input
  };

 private:
  std::string name_;
  std::vector<int64_t> out_segments_;
  std::shared_ptr<ProcessGroup> group_;
  bool sequence_parallel_;
  Scratch scratch_;
};

// Several column-parallel layers that read one input, their outputs side by side: a fused
// c_attn is one layer, Llama's q, k and v under their own HF names are three. The input is
// gathered once under sequence parallelism and the d_input they sum to is reduced once.
// ColumnParallelLinear::forward and backward are the one-layer case. Every layer must share
// the group, the sequence-parallel setting and in_features.
// out / d_out: [rows, sum of the layers' local widths].
void column_parallel_forward(const std::vector<ColumnParallelLinear*>& layers, const Tensor& out,
                             const Tensor& input, ColumnParallelLinear::Scratch& scratch);
// d_input (shaped like input) gets every layer's input gradient summed over tp, written or
// added; weight and bias gradients are accumulated. The input gather is issued before the
// input-gradient products and the d_input reduction before the weight-gradient products, so
// each communication overlaps compute.
void column_parallel_backward(const std::vector<ColumnParallelLinear*>& layers, const Tensor& d_input,
                              bool accumulate_input, const Tensor& d_out, int64_t d_out_col,
                              const Tensor& input, ColumnParallelLinear::Scratch& scratch);

class RowParallelLinear {
 public:
  // Full weight [out_features, in_features]; rank r holds columns [r*in/tp, (r+1)*in/tp) and
  // the whole bias, which is added once, after the reduction.
  RowParallelLinear(std::string name, int64_t in_features, int64_t out_features, bool bias,
                    std::shared_ptr<ProcessGroup> group, bool sequence_parallel,
                    bool hf_transposed = false);

  // input: [rows, in/tp] (the column-parallel side's output). out: [rows, out], the same on
  // every tp rank, or under sequence parallelism this rank's rows [rows/tp, out].
  void forward(const Tensor& out, const Tensor& input);
  // d_out shaped like forward's out; d_input [rows, in/tp] written or added; weight gradient
  // accumulated. Without sequence parallelism the bias gradient is complete on every rank;
  // with it, it comes from this rank's rows only and must be summed over tp once per step,
  // like a norm weight's: sequence_parallel_partial_grads() lists it for
  // all_reduce_sequence_parallel_grads.
  void backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                const Tensor& input);

  // Parameters whose gradient is partial over tp: {bias} under sequence parallelism, else {}.
  ParameterList sequence_parallel_partial_grads();

  // Copies this rank's shard out of the full weight [out, in]; the bias [out] whole.
  void load_full(const Tensor& full_weight, const Tensor* full_bias);
  void collect(ParameterList& out) { local.collect(out); }

  int64_t local_in_features() const { return local.in_features(); }
  int64_t out_features() const { return local.out_features(); }
  bool sequence_parallel() const { return sequence_parallel_; }
  ProcessGroup& group() const { return *group_; }

  Linear local;  // [out, in/tp] and the whole bias

 private:
  std::string name_;
  std::shared_ptr<ProcessGroup> group_;
  bool sequence_parallel_;
  Tensor full_rows_;  // [rows, out]: partial output before reduce-scatter / gathered d_out
};

}  // namespace loom
