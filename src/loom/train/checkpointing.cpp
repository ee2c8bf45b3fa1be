#include "loom/train/checkpointing.hpp"

#include <fstream>

#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/core/error.hpp"

namespace loom {

CheckpointPayload make_checkpoint_payload(const Transformer& model, const NamedTensors& optimizer_state,
                                          const nlohmann::json& trainer_state) {
  CheckpointPayload payload;
  payload.config = model.config();
  payload.model_weights = export_hf_weights(model.parameters(), DType::F32);
  for (const auto& [name, tensor] : optimizer_state)
    payload.optimizer_state.push_back(entry_from_tensor(name, tensor));
  payload.trainer_state = trainer_state;
  return payload;
}

void require_same_model(const ModelConfig& expected, const ModelConfig& found, const std::string& source) {
  auto check = [&](const char* field, auto want, auto got) {
    if (want != got)
      throw_error(source, ": model.", field, " is ", got, " in the checkpoint but ", want,
                  " in the configuration (vocabulary or shape mismatch)");
  };
  check("arch", std::string(architecture_name(expected.arch)), std::string(architecture_name(found.arch)));
  check("vocab_size", expected.vocab_size, found.vocab_size);
  check("n_layer", expected.n_layer, found.n_layer);
  check("n_embd", expected.n_embd, found.n_embd);
  check("n_head", expected.n_head, found.n_head);
  check("n_kv_head", expected.n_kv_head, found.n_kv_head);
  check("ffn_hidden", expected.ffn_hidden, found.ffn_hidden);
  check("max_seq_len", expected.max_seq_len, found.max_seq_len);
  check("tied_embeddings", expected.tied_embeddings, found.tied_embeddings);
  check("norm_eps", expected.norm_eps, found.norm_eps);
  if (expected.arch == Architecture::Llama) check("rope_theta", expected.rope_theta, found.rope_theta);
}

nlohmann::json restore_checkpoint(const std::string& dir_or_root, Transformer& model,
                                  const OptimizerStateSink& load_optimizer) {
  const std::string dir = latest_checkpoint(dir_or_root).value_or(dir_or_root);
  const CheckpointPayload payload = load_checkpoint(dir);
  require_same_model(model.config(), payload.config, dir);
  SafetensorsFile weights;
  weights.path = dir + "/model.safetensors";
  weights.entries = payload.model_weights;
  import_hf_weights(model.parameters(), weights);
  if (load_optimizer) {
    NamedTensors state;
    for (const SafetensorsEntry& e : payload.optimizer_state)
      state.emplace_back(e.name, tensor_from_entry(e, MemCategory::Workspace));
    load_optimizer(state, payload.trainer_state.value("optimizer_steps", int64_t{0}));
  }
  return payload.trainer_state;
}

ModelConfig checkpoint_model_config(const std::string& dir_or_root) {
  std::string dir = dir_or_root;
  if (auto latest = latest_checkpoint(dir_or_root)) dir = *latest;
  std::ifstream in(dir + "/config.json");
  if (!in) throw_error("checkpoint ", dir, ": config.json is missing");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const std::exception& e) {
    throw_error("checkpoint ", dir, "/config.json: ", e.what());
  }
  return model_config_from_hf_json(json);
}

}  // namespace loom
