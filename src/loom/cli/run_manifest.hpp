#pragma once
// run.json: what a training run was asked to do (model, layout, precision, steps, tokens per
// step, data, where its checkpoints and trace go), written by `loom train` into log.dir before
// the first step, so that `loom report` can describe a run from its directory alone.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/train/train_config.hpp"

namespace loom::cli {

inline constexpr const char* kRunManifestFile = "run.json";

// `dp` is the data-parallel degree the launch gave (the trainer's), `world_size` its ranks.
// Paths (config, checkpoints, trace) are absolute, so the file means the same from anywhere.
nlohmann::json run_manifest_json(const TrainConfig& config, const std::string& config_path,
                                 int64_t dp, int world_size);

// Writes run_manifest_json into config.run_dir/run.json (created if missing), atomically.
void write_run_manifest(const TrainConfig& config, const std::string& config_path, int64_t dp,
                        int world_size);

// The model's shape as run.json records it: arch, n_layer, n_embd, n_head, n_kv_head,
// ffn_hidden, vocab_size, max_seq_len, n_experts, experts_per_token, parameters.
nlohmann::json model_summary_json(const ModelConfig& model);

// "gpt2, 2 layers, d=32, 4 heads, ffn 128, vocab 64, 52.1k parameters" from those fields (and
// kv heads, experts where they apply); a field that is absent is left out.
std::string describe_model(const nlohmann::json& model_summary);

// The report's configuration rows from a run.json: model, layout and ranks, precision and
// device, steps, tokens per step, learning rate, data, checkpoints, trace, config file. A field
// the file lacks (an older or hand-written run.json) leaves its row out; one of the wrong type
// throws loom::Error naming `source` and the field.
std::vector<std::pair<std::string, std::string>> run_manifest_rows(const nlohmann::json& manifest,
                                                                   const std::string& source);

}  // namespace loom::cli
