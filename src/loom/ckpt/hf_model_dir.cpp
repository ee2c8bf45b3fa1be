// CheckpointReader::hugging_face_model: weights from a Hugging Face model directory, read
// through the same interface as loom's checkpoints, so a run starts from them on any layout.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/core/error.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";  // transformers' sharded weights
constexpr const char* kGpt2Prefix = "transformer.";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw_error("Hugging Face model: cannot open '", path.string(), "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error("Hugging Face model: '", path.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

CheckpointReader CheckpointReader::hugging_face_model(const std::string& dir_string) {
  const fs::path dir(dir_string);
  if (!fs::is_directory(dir)) throw_error("Hugging Face model directory '", dir_string, "' does not exist");
  CheckpointReader reader;
  reader.dir_ = dir_string;
  try {
    reader.config_ = model_config_from_hf_json(read_json(dir / "config.json"));
  } catch (const Error& e) {
    throw_error("'", (dir / "config.json").string(), "': ", e.what());
  }
  reader.trainer_state_ = nlohmann::json::object();

  std::vector<std::string> files;
  if (fs::exists(dir / kIndexFile)) {
    const nlohmann::json index = read_json(dir / kIndexFile);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw_error("'", (dir / kIndexFile).string(), "' has no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw_error("'", (dir / kIndexFile).string(), "': tensor '", tensor, "' maps to ", file.dump());
      const std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw_error("'", (dir / kIndexFile).string(), "': tensor '", tensor, "' maps to '", name,
                    "', which is not a file name in the model directory");
      names.insert(name);
    }
    files.assign(names.begin(), names.end());
  } else if (fs::exists(dir / kSingleFile)) {
    files = {kSingleFile};
  } else {
    throw_error("Hugging Face model directory '", dir_string, "' has neither ", kSingleFile, " nor ", kIndexFile);
  }
  const bool gpt2 = reader.config_.arch == Architecture::GPT2;
  for (const std::string& file : files) {
    reader.files_.push_back(std::make_unique<SafetensorsFile>(read_safetensors((dir / file).string())));
    for (const SafetensorsEntry& e : reader.files_.back()->entries) {
      std::string name = e.name;
      // The hub's gpt2 stores GPT2Model's tensors ("h.0.attn.c_attn.weight"); transformers adds
      // the prefix of GPT2LMHeadModel on load, and so does this.
      if (gpt2 && name.rfind(kGpt2Prefix, 0) != 0 && name.rfind("lm_head.", 0) != 0) name = kGpt2Prefix + name;
      if (!reader.tensors_.emplace(name, Stored{e.shape, {{&e, 0, shape_numel(e.shape), 0}}, true}).second)
        throw_error("Hugging Face model directory '", dir_string, "': tensor '", name, "' appears twice");
    }
  }
  return reader;
}

}  // namespace loom
