#pragma once
// Normalisation layer: LayerNorm with bias (GPT-2) or RMSNorm without (Llama).
#include <string>

#include "loom/model/parameter.hpp"

namespace loom {

enum class NormKind { LayerNorm, RMSNorm };

// What a norm's forward saves for its backward: per-row mean (LayerNorm only) and 1/std.
struct NormStash {
  Tensor mean, rstd;
};

class Norm {
 public:
  Norm(NormKind kind, std::string name, int64_t dim, float eps);
  // input, out: [rows, dim].
  void forward(const Tensor& out, NormStash& stash, const Tensor& input) const;
  // The residual add before the norm, then the norm of the sum: sum = residual + delta (sum may
  // be either of them), rounded to bf16 values when round_sum_to_bf16, then forward(out, stash,
  // sum) (ops::add_norm_forward: one fused kernel on CUDA in bf16).
  void forward_added(const Tensor& out, NormStash& stash, const Tensor& sum, const Tensor& residual,
                     const Tensor& delta, bool round_sum_to_bf16) const;
  // d_input accumulated.
  void backward(const Tensor& d_input, const Tensor& d_out, const Tensor& input,
                const NormStash& stash);
  void collect(ParameterList& out);
  NormKind kind() const { return kind_; }

  Parameter weight, bias;

 private:
  NormKind kind_;
  float eps_;
};

}  // namespace loom
