#pragma once
// Every parameter of a model described without allocating it: HF name, shape (loom layout), the
// unit it belongs to (Transformer::unit_parameters), in the order backward finishes their
// gradients (Transformer::parameters_in_grad_ready_order), and where it sits: which part of the
// model (so which pipeline stage holds it) and which dimension tensor parallelism splits. The
// planner sizes models of any scale and counts each rank's parameters from this;
// tests/test_model.cpp checks it against a constructed Transformer, and the dist tests check the
// placement against the tensor-parallel and pipelined models.
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/model/config.hpp"

namespace loom {

// The part of the model a parameter belongs to: the pipeline's first stage holds the tables,
// the last the final norm and the head (and, with tied embeddings, a copy of the token table).
enum class ModelPart { Block, TokenTable, PositionTable, FinalNorm, OutputHead };

struct ParameterSpec {
  std::string name;
  Shape shape;
  int64_t unit = 0;      // 0: embeddings, final norm, head; l + 1: block l
  bool expert = false;   // one expert's weight in a mixture of experts: sharded over ep
  // The dimension tensor parallelism splits into blocks of ceil(n / tp) (0: the output rows of
  // a column-parallel weight or bias, or the vocabulary rows of a table or head; 1: the input
  // columns of a row-parallel weight); -1: whole on every tp rank (norms, row-parallel biases,
  // GPT-2's position table, a router).
  int tp_dim = -1;
  ModelPart part = ModelPart::Block;
  int64_t expert_index = -1;  // which expert of its layer (expert weights only); ep rank
                              // e holds experts [e E/ep, (e + 1) E/ep)

  int64_t numel() const { return shape_numel(shape); }
  // Part of a mixture-of-experts block's feed-forward (router, experts, shared experts: HF's
  // `block_sparse_moe.`), which loom's engine keeps whole on every tp rank.
  bool in_moe_block() const { return name.find(".block_sparse_moe.") != std::string::npos; }
  // Elements tp rank `rank` of `tp` holds: its block of tp_dim (the last block may be short).
  int64_t numel_on_tp_rank(int64_t tp, int64_t rank) const;
};

std::vector<ParameterSpec> parameter_specs(const ModelConfig& config);

}  // namespace loom
