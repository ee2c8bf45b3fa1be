#pragma once
// Every parameter of a model described without allocating it: HF name, shape (loom layout) and
// the unit it belongs to (Transformer::unit_parameters), in the order backward finishes their
// gradients (Transformer::parameters_in_grad_ready_order). The planner sizes models of any
// scale from this; tests/test_model.cpp checks it against a constructed Transformer.
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/model/config.hpp"

namespace loom {

struct ParameterSpec {
  std::string name;
  Shape shape;
  int64_t unit;  // 0: embeddings, final norm, head; l + 1: block l
  bool expert = false;  // one expert's weight in a mixture of experts: sharded over ep
  int64_t numel() const { return shape_numel(shape); }
};

std::vector<ParameterSpec> parameter_specs(const ModelConfig& config);

}  // namespace loom
