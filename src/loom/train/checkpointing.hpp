#pragma once
// Glue between a training run and ckpt/: what goes into a checkpoint (HF weights, optimizer
// moments, trainer state) and how a run is restored from one.
#include <nlohmann/json.hpp>
#include <string>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/model/transformer.hpp"
#include "loom/train/adamw.hpp"

namespace loom {

CheckpointPayload make_checkpoint_payload(const Transformer& model, const AdamW* optimizer,
                                          const nlohmann::json& trainer_state);

// Loads weights (and optimizer state when `optimizer` is given) into an already built model
// whose config must match the checkpoint's; returns the trainer state. A mismatch (e.g. a
// different vocabulary) is an error naming the field and both values.
nlohmann::json restore_checkpoint(const std::string& dir_or_root, Transformer& model,
                                  AdamW* optimizer);

// Builds nothing: reads only the model config of a checkpoint.
ModelConfig checkpoint_model_config(const std::string& dir_or_root);

void require_same_model(const ModelConfig& expected, const ModelConfig& found, const std::string& source);

}  // namespace loom
