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
  void forward(float* out, NormStash& stash, const float* input, int64_t rows) const;
  // d_input accumulated.
  void backward(float* d_input, const float* d_out, const float* input, const NormStash& stash,
                int64_t rows);
  void collect(ParameterList& out);
  NormKind kind() const { return kind_; }

  Parameter weight, bias;

 private:
  NormKind kind_;
  int64_t dim_;
  float eps_;
};

}  // namespace loom
