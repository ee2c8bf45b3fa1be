// Transformer::enable_fp8: the blocks' projections switched to FP8 GEMMs (model/fp8_linear.hpp).
#include "loom/core/error.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/transformer.hpp"

namespace loom {

Fp8Training& Transformer::enable_fp8(const Fp8Config& config) {
  LOOM_CHECK(!fp8_, "FP8 training is already on for this model");
  auto context = std::make_shared<Fp8Context>();
  context->config = config;
  std::vector<Fp8Linear*> layers;
  auto add = [&](std::vector<Linear*> linears, const char* what) {
    if (linears.empty())
      throw_error("train.precision = \"fp8\": the ", what,
                  " projections of this model are not plain linear layers "
                  "(tensor parallelism?); FP8 runs in one process or under data parallelism");
    for (Linear* linear : linears) layers.push_back(linear->enable_fp8(context));
  };
  for (auto& block : blocks) {
    if (block->moe)
      throw_error("train.precision = \"fp8\" with model.n_experts = ", config_.n_experts,
                  ": the experts' grouped GEMMs have no FP8 path; use a dense model or "
                  "train.precision = \"bf16\"");
    add(block->attention.input_projection->linears(), "attention input");
    add(block->attention.output_projection->linears(), "attention output");
    add(block->mlp->input_projection->linears(), "MLP input");
    add(block->mlp->output_projection->linears(), "MLP output");
  }
  fp8_ = std::make_unique<Fp8Training>(std::move(context), std::move(layers));
  return *fp8_;
}

}  // namespace loom
