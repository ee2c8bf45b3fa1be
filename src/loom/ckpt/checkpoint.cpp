#include "loom/ckpt/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string_view>
#include <system_error>
#include <utility>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/safetensors_writer.hpp"
#include "loom/core/error.hpp"

namespace loom {

using namespace ckpt_files;
using json = nlohmann::json;

namespace {

struct FileToWrite {
  const char* name;
  std::string bytes;
};

std::vector<FileToWrite> serialize_payload(const CheckpointPayload& payload) {
  if (!payload.trainer_state.is_object())
    throw_error("trainer_state is ", payload.trainer_state.type_name(), ", expected a JSON object");
  const auto tensors = [](const char* file, const std::vector<SafetensorsEntry>& entries,
                          const std::map<std::string, std::string>& metadata) {
    try {
      const std::vector<uint8_t> bytes = serialize_safetensors(entries, metadata);
      return std::string(bytes.begin(), bytes.end());
    } catch (const Error& e) {
      throw_error(file, ": ", e.what());
    }
  };
  // transformers refuses safetensors files whose metadata lacks a known "format".
  return {{kModelFile, tensors(kModelFile, payload.model_weights, {{"format", "pt"}})},
          {kConfigFile, dump_json(hf_config_json(payload.config), "config.json")},
          {kOptimizerFile, tensors(kOptimizerFile, payload.optimizer_state, {})},
          {kTrainerStateFile, dump_json(payload.trainer_state, "trainer_state")}};
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08" PRId64, step);
  return name;
}

namespace {

// One file of a checkpoint: `write` puts it into the temp directory and returns its record.
struct FileWriter {
  const char* name;
  std::function<FileRecord(const fs::path& dir)> write;
};

// The save protocol both entries share: temp directory, the files in order (the hook after
// each), the manifest last, then install (rename, `latest`, pruning).
std::string write_checkpoint_files(const std::string& root, int64_t step,
                                   const std::vector<FileWriter>& files, int keep_last,
                                   const AfterFileHook& after_file, const std::string& context) {
  const fs::path root_path = root;
  const fs::path temp_dir = create_temp_dir(root_path, step, std::to_string(::getpid()), context);
  RemoveOnFailure cleanup(temp_dir);
  try {
    std::vector<FileRecord> records;
    for (const FileWriter& file : files) {
      records.push_back(file.write(temp_dir));
      if (after_file) after_file(file.name);
    }
    write_manifest(temp_dir, step, records);
    const std::string final_dir = install_checkpoint(temp_dir, root_path, step, keep_last);
    cleanup.disarm();
    return final_dir;
  } catch (const Error& e) {
    throw_error(context, ": ", e.what());
  }
}

std::string checked_context(const std::string& root, int64_t step, int keep_last) {
  const std::string context =
      "cannot save checkpoint step " + std::to_string(step) + " under '" + root + "'";
  if (step < 0) throw_error(context, ": step must be >= 0");
  if (keep_last < 0)
    throw_error(context, ": keep_last is ", keep_last, ", expected >= 0 (0 keeps all)");
  return context;
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointPayload& payload,
                            int keep_last, const AfterFileHook& after_file) {
  const std::string context = checked_context(root, step, keep_last);
  // Everything that can fail on bad input is done before the disk is touched.
  std::vector<FileToWrite> files;
  try {
    files = serialize_payload(payload);
  } catch (const Error& e) {
    throw_error(context, ": ", e.what());
  }
  std::vector<FileWriter> writers;
  for (const FileToWrite& file : files)
    writers.push_back({file.name, [&file](const fs::path& dir) {
                         return write_recorded(dir, file.name, file.bytes);
                       }});
  return write_checkpoint_files(root, step, writers, keep_last, after_file, context);
}

std::string save_checkpoint_spans(const std::string& root, int64_t step,
                                  const CheckpointSpans& spans, int keep_last,
                                  const AfterFileHook& after_file) {
  const std::string context = checked_context(root, step, keep_last);
  if (!spans.trainer_state.is_object())
    throw_error(context, ": trainer_state is ", spans.trainer_state.type_name(),
                ", expected a JSON object");
  const std::string config = dump_json(hf_config_json(spans.config), "config.json");
  const std::string state = dump_json(spans.trainer_state, "trainer_state");
  auto tensors = [](const char* name, const std::vector<TensorSpans>& entries,
                    const std::map<std::string, std::string>& metadata) {
    return [name, &entries, metadata](const fs::path& dir) {
      const WrittenFile written = write_safetensors_spans((dir / name).string(), entries, metadata);
      return FileRecord{name, written.bytes, crc32_hex(written.crc32)};
    };
  };
  auto text = [](const char* name, const std::string& bytes) {
    return [name, &bytes](const fs::path& dir) { return write_recorded(dir, name, bytes); };
  };
  // The order and metadata of serialize_payload, so the files are the same byte for byte.
  const std::vector<FileWriter> writers = {
      {kModelFile, tensors(kModelFile, spans.model_weights, {{"format", "pt"}})},
      {kConfigFile, text(kConfigFile, config)},
      {kOptimizerFile, tensors(kOptimizerFile, spans.optimizer_state, {})},
      {kTrainerStateFile, text(kTrainerStateFile, state)}};
  return write_checkpoint_files(root, step, writers, keep_last, after_file, context);
}

CheckpointPayload load_checkpoint(const std::string& dir_or_root) {
  const fs::path dir = resolve_checkpoint_dir(dir_or_root);
  const json manifest = read_manifest(dir);

  // Every file is verified before any is parsed, so a damaged checkpoint fails as a whole.
  const std::vector<uint8_t> model_bytes = read_verified(dir, manifest, kModelFile);
  const std::vector<uint8_t> config_bytes = read_verified(dir, manifest, kConfigFile);
  const std::vector<uint8_t> optimizer_bytes = read_verified(dir, manifest, kOptimizerFile);
  const std::vector<uint8_t> trainer_bytes = read_verified(dir, manifest, kTrainerStateFile);

  CheckpointPayload payload;
  const fs::path config_path = dir / kConfigFile;
  try {
    payload.config = model_config_from_hf_json(parse_json_file(config_bytes, config_path));
  } catch (const Error& e) {
    throw_error("'", config_path.string(), "': ", e.what());
  }
  payload.model_weights =
      parse_safetensors(model_bytes.data(), model_bytes.size(), (dir / kModelFile).string()).entries;
  payload.optimizer_state =
      parse_safetensors(optimizer_bytes.data(), optimizer_bytes.size(), (dir / kOptimizerFile).string()).entries;
  payload.trainer_state = parse_json_file(trainer_bytes, dir / kTrainerStateFile);
  return payload;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  const fs::path root_path = root;
  std::error_code ec;
  if (!fs::is_directory(root_path, ec)) return std::nullopt;

  const fs::path latest_path = root_path / kLatestFile;
  if (fs::exists(latest_path, ec)) {
    const std::vector<uint8_t> bytes = read_file_bytes(latest_path.string());
    std::string name(bytes.begin(), bytes.end());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (!parse_step_dir_name(name))
      throw_error("'", latest_path.string(), "' holds '", name, "', expected a step_<N> directory name");
    if (fs::exists(root_path / name / kManifestFile, ec)) return (root_path / name).string();
    // `latest` names a directory that is gone (deleted by hand, or a crash while re-saving
    // that step): fall back to the newest finished checkpoint.
  }
  const std::vector<StepDir> dirs = list_step_dirs(root_path);
  if (dirs.empty()) return std::nullopt;
  const auto newest =
      std::max_element(dirs.begin(), dirs.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return newest->path.string();
}

}  // namespace loom
