#pragma once
// A linear layer y = x W^T (+ b) with W stored [out, in]. Its output may be written into a
// column block of a wider tensor (out_col), so q/k/v or gate/up projections fill one fused
// activation without a copy. It computes through loom::ops, on whichever device its
// parameters and the tensors it is handed live.
#include <memory>
#include <string>

#include "loom/model/fp8_linear.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

class Linear {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, bool bias,
         bool hf_transposed);
  // out[:, out_col : out_col + out_features] = input W^T (+ b); input [rows, in].
  void forward(const Tensor& out, int64_t out_col, const Tensor& input) const;
  // From d_out[:, d_out_col : d_out_col + out_features]: d_input (undefined to skip) written
  // or accumulated; weight/bias gradients accumulated.
  void backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                int64_t d_out_col, const Tensor& input);
  // The pieces tensor-parallel layers (parallel/tensor_parallel_linear) put their collectives
  // between, each through the FP8 path when it is on: the forward's product without the bias
  // (a row-parallel layer adds it once, after the sum); the input gradient alone (written or
  // accumulated); the weight gradient, and the bias's with `with_bias`, alone (accumulated).
  // In FP8 (per-tensor recipes) the output gradient input_grad quantised serves the weight_grad
  // of the same d_out that follows it (Fp8Linear::backward_input_half).
  void forward_unbiased(const Tensor& out, int64_t out_col, const Tensor& input) const;
  void input_grad(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                  int64_t d_out_col) const;
  void weight_grad(const Tensor& d_out, int64_t d_out_col, const Tensor& input, bool with_bias);
  // backward without the bias gradient (a row-parallel layer's under sequence parallelism,
  // which sums its rows' part over tp itself).
  void backward_unbiased(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                         int64_t d_out_col, const Tensor& input);
  // forward(pre, 0, input) and act = gelu(pre) from one product, or false having written
  // nothing (FP8 layers, and wherever ops::linear_gelu_forward declines).
  bool forward_gelu(const Tensor& act, const Tensor& pre, const Tensor& input) const;
  // backward with input = gelu(pre): d_pre written, gradients accumulated; or false having
  // written nothing (FP8 layers, and wherever ops::linear_backward_through_gelu declines).
  bool backward_through_gelu(const Tensor& d_pre, const Tensor& d_out, const Tensor& input,
                             const Tensor& pre);
  void collect(ParameterList& out);
  // From now on both GEMMs run on FP8-quantised operands (model/fp8_linear.hpp); returns the
  // layer's scaling state, owned here.
  Fp8Linear* enable_fp8(std::shared_ptr<Fp8Context> context);

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Parameter weight;
  Parameter bias;  // unnamed when the layer has no bias
  // By name, not by value: under ZeRO-3 a present bias has no value between uses.
  bool has_bias() const { return !bias.name.empty(); }

 private:
  int64_t in_features_, out_features_;
  std::unique_ptr<Fp8Linear> fp8_;  // null: f32 (or bf16) GEMMs
};

// Allocates value and gradient tensors of a parameter (on the CPU, f32; Transformer::to_device
// moves them).
void allocate_parameter(Parameter& p, std::string name, const Shape& shape, bool weight_decay,
                        bool hf_transposed = false);

}  // namespace loom
