#pragma once
// Glue between a training run and ckpt/: what goes into a checkpoint (HF weights, optimizer
// moments, trainer state) and how a run is restored from one.
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/model/transformer.hpp"
#include "loom/train/adamw.hpp"

namespace loom {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// `optimizer_state`: full (unsharded) tensors named as AdamW::state_tensors names them.
CheckpointPayload make_checkpoint_payload(const Transformer& model, const NamedTensors& optimizer_state,
                                          const nlohmann::json& trainer_state);

// Loads weights (and optimizer state when `optimizer` is given) into an already built model
// whose config must match the checkpoint's; returns the trainer state. A mismatch (e.g. a
// different vocabulary) is an error naming the field and both values.
// `load_optimizer` (may be empty) receives the optimizer tensors and AdamW's step count.
using OptimizerStateSink = std::function<void(const NamedTensors&, int64_t steps_taken)>;
nlohmann::json restore_checkpoint(const std::string& dir_or_root, Transformer& model,
                                  const OptimizerStateSink& load_optimizer);

// Builds nothing: reads only the model config of a checkpoint.
ModelConfig checkpoint_model_config(const std::string& dir_or_root);

void require_same_model(const ModelConfig& expected, const ModelConfig& found, const std::string& source);

}  // namespace loom
