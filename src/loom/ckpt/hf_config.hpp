#pragma once
// ModelConfig <-> Hugging Face config.json, so a loom checkpoint directory loads with
// transformers' from_pretrained and an HF model directory loads into loom. Key names follow
// transformers' GPT2Config and LlamaConfig.
#include <nlohmann/json.hpp>

#include "loom/model/config.hpp"

namespace loom {

// Validates the config first; an invalid one is never written out.
nlohmann::json hf_config_json(const ModelConfig& config);

// The inverse. Keys that HF itself defaults (GPT-2 n_inner, Llama num_key_value_heads,
// rope_theta, tie_word_embeddings) may be absent; others are required. Throws loom::Error
// naming the missing or invalid key, or a feature loom does not implement (e.g. rope_scaling),
// then validates the result.
ModelConfig model_config_from_hf_json(const nlohmann::json& hf);

}  // namespace loom
