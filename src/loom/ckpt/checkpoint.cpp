#include "loom/ckpt/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string_view>
#include <system_error>
#include <utility>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/core/error.hpp"

namespace loom {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kTrainerStateFile = "trainer_state.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kLatestFile = "latest";
constexpr const char* kManifestFormat = "loom.checkpoint.v1";
constexpr const char* kStepPrefix = "step_";
// In-progress and replaced directories carry this marker so no reader mistakes them for a
// finished checkpoint: "step_<N>.tmp-<pid>" and "step_<N>.tmp-replaced-<pid>".
constexpr const char* kTempMarker = ".tmp-";
constexpr int kJsonIndent = 2;
constexpr size_t kMaxStepDigits = 18;  // keeps the parsed step inside int64_t

// The step of a finished checkpoint directory name ("step_<digits>" exactly), else nullopt.
std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  const std::string_view prefix = kStepPrefix;
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > kMaxStepDigits) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

struct StepDir {
  int64_t step;
  fs::path path;
};

// Finished checkpoint directories under root (those with a manifest), in no particular order.
std::vector<StepDir> list_step_dirs(const fs::path& root) {
  std::vector<StepDir> out;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const auto step = parse_step_dir_name(entry.path().filename().string());
    if (step && entry.is_directory(ec) && fs::exists(entry.path() / kManifestFile, ec))
      out.push_back({*step, entry.path()});
  }
  if (ec) throw_error("cannot list checkpoint root '", root.string(), "': ", ec.message());
  return out;
}

std::string dump_json(const json& value, const std::string& what) {
  try {
    return value.dump(kJsonIndent) + "\n";
  } catch (const json::exception& e) {
    throw_error("cannot encode ", what, " as JSON: ", e.what());
  }
}

// Removes a half-built checkpoint directory unless the save got far enough to keep it.
class RemoveOnFailure {
 public:
  explicit RemoveOnFailure(fs::path path) : path_(std::move(path)) {}
  ~RemoveOnFailure() {
    std::error_code ignored;  // already unwinding from the real error; that one is reported
    if (armed_) fs::remove_all(path_, ignored);
  }
  RemoveOnFailure(const RemoveOnFailure&) = delete;
  RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
  void disarm() { armed_ = false; }

 private:
  fs::path path_;
  bool armed_ = true;
};

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

void write_checkpoint_files(const fs::path& dir, int64_t step, const std::vector<FileToWrite>& files) {
  json manifest = {{"format", kManifestFormat}, {"step", step}, {"files", json::object()}};
  for (const FileToWrite& file : files) {
    atomic_write_file((dir / file.name).string(), file.bytes);
    manifest["files"][file.name] = {{"bytes", file.bytes.size()},
                                    {"crc32", crc32_hex(crc32_of(file.bytes.data(), file.bytes.size()))}};
  }
  // Written last: a directory with a manifest is complete.
  atomic_write_file((dir / kManifestFile).string(), dump_json(manifest, "manifest"));
}

// Renames the finished temp directory to `final_dir`. An existing checkpoint of the same step
// is moved aside first and returned, to be deleted once the new one is in place; if the
// rename fails it is moved back.
std::optional<fs::path> install_directory(const fs::path& temp_dir, const fs::path& final_dir) {
  std::error_code ec;
  std::optional<fs::path> replaced;
  if (fs::exists(fs::symlink_status(final_dir, ec))) {
    if (!fs::is_directory(fs::symlink_status(final_dir, ec)))
      throw_error("'", final_dir.string(), "' exists and is not a checkpoint directory; refusing to replace it");
    replaced = final_dir;
    replaced->replace_filename(final_dir.filename().string() + kTempMarker + "replaced-" + std::to_string(::getpid()));
    fs::remove_all(*replaced, ec);
    fs::rename(final_dir, *replaced, ec);
    if (ec) throw_error("cannot move old '", final_dir.string(), "' aside to '", replaced->string(), "': ", ec.message());
  }
  fs::rename(temp_dir, final_dir, ec);
  if (ec) {
    const std::string reason = ec.message();
    std::string restore_note;
    if (replaced) {
      fs::rename(*replaced, final_dir, ec);
      if (ec) restore_note = "; the previous checkpoint is still in '" + replaced->string() + "'";
    }
    throw_error("cannot rename '", temp_dir.string(), "' to '", final_dir.string(), "': ", reason, restore_note);
  }
  fsync_directory(final_dir.parent_path().string());
  return replaced;
}

// Keeps the newest keep_last checkpoints by step, plus the one just written.
void prune_checkpoints(const fs::path& root, int keep_last, const fs::path& just_written) {
  std::vector<StepDir> dirs = list_step_dirs(root);
  std::sort(dirs.begin(), dirs.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  for (size_t i = static_cast<size_t>(keep_last); i < dirs.size(); ++i) {
    if (dirs[i].path == just_written) continue;
    std::error_code ec;
    fs::remove_all(dirs[i].path, ec);
    if (ec)
      throw_error("checkpoint '", just_written.string(), "' was saved, but pruning old checkpoint '",
                  dirs[i].path.string(), "' failed: ", ec.message());
  }
}

std::vector<uint8_t> read_verified(const fs::path& dir, const json& manifest, const char* name) {
  const fs::path path = dir / name;
  const std::string manifest_path = (dir / kManifestFile).string();
  const json* record = nullptr;
  if (manifest.contains("files") && manifest["files"].is_object() && manifest["files"].contains(name))
    record = &manifest["files"][name];
  if (!record || !record->is_object() || !record->contains("bytes") || !(*record)["bytes"].is_number_unsigned() ||
      !record->contains("crc32") || !(*record)["crc32"].is_string())
    throw_error("'", manifest_path, "' has no valid record (bytes, crc32) for '", name, "'");
  const std::vector<uint8_t> bytes = read_file_bytes(path.string());
  const auto expected_bytes = (*record)["bytes"].get<uint64_t>();
  if (bytes.size() != expected_bytes)
    throw_error("checkpoint file '", path.string(), "' is ", bytes.size(), " bytes, but the manifest records ",
                expected_bytes, ": the file is truncated or was modified");
  const std::string crc = crc32_hex(crc32_of(bytes.data(), bytes.size()));
  const auto expected_crc = (*record)["crc32"].get<std::string>();
  if (crc != expected_crc)
    throw_error("checkpoint file '", path.string(), "' has CRC32 ", crc, ", but the manifest records ", expected_crc,
                ": the file is corrupt");
  return bytes;
}

json parse_json_file(const std::vector<uint8_t>& bytes, const fs::path& path) {
  try {
    return json::parse(bytes.begin(), bytes.end());
  } catch (const json::parse_error& e) {
    throw_error("'", path.string(), "' is not valid JSON: ", e.what());
  }
}

fs::path resolve_checkpoint_dir(const std::string& dir_or_root) {
  const fs::path path = dir_or_root;
  std::error_code ec;
  if (fs::exists(path / kManifestFile, ec)) return path;
  if (!fs::is_directory(path, ec))
    throw_error("checkpoint path '", dir_or_root, "' is not a directory");
  const std::optional<std::string> latest = latest_checkpoint(dir_or_root);
  if (!latest)
    throw_error("'", dir_or_root, "' is neither a checkpoint directory (no ", kManifestFile,
                ") nor a root holding one (no step_<N> directory with a manifest)");
  return *latest;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08" PRId64, step);
  return name;
}

std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointPayload& payload, int keep_last) {
  const std::string context = "cannot save checkpoint step " + std::to_string(step) + " under '" + root + "'";
  if (step < 0) throw_error(context, ": step must be >= 0");
  if (keep_last < 0) throw_error(context, ": keep_last is ", keep_last, ", expected >= 0 (0 keeps all)");

  // Everything that can fail on bad input is done before the disk is touched.
  std::vector<FileToWrite> files;
  try {
    files = serialize_payload(payload);
  } catch (const Error& e) {
    throw_error(context, ": ", e.what());
  }

  const fs::path root_path = root;
  std::error_code ec;
  fs::create_directories(root_path, ec);
  if (!fs::is_directory(root_path))
    throw_error(context, ": the root is not a directory", ec ? " (" + ec.message() + ")" : std::string());

  const std::string dir_name = checkpoint_dir_name(step);
  const fs::path temp_dir = root_path / (dir_name + kTempMarker + std::to_string(::getpid()));
  const fs::path final_dir = root_path / dir_name;
  fs::remove_all(temp_dir, ec);  // a leftover from an earlier crash of a process with our pid
  if (!fs::create_directory(temp_dir, ec) || ec)
    throw_error(context, ": cannot create '", temp_dir.string(), "': ", ec ? ec.message() : "already exists");

  RemoveOnFailure cleanup(temp_dir);
  std::optional<fs::path> replaced;
  try {
    write_checkpoint_files(temp_dir, step, files);
    replaced = install_directory(temp_dir, final_dir);
  } catch (const Error& e) {
    throw_error(context, ": ", e.what());
  }
  cleanup.disarm();
  atomic_write_file((root_path / kLatestFile).string(), dir_name + "\n");

  if (replaced) {
    fs::remove_all(*replaced, ec);
    if (ec)
      throw_error("checkpoint '", final_dir.string(), "' was saved, but removing the replaced copy '",
                  replaced->string(), "' failed: ", ec.message());
  }
  if (keep_last > 0) prune_checkpoints(root_path, keep_last, final_dir);
  return final_dir.string();
}

CheckpointPayload load_checkpoint(const std::string& dir_or_root) {
  const fs::path dir = resolve_checkpoint_dir(dir_or_root);
  const fs::path manifest_path = dir / kManifestFile;
  const json manifest = parse_json_file(read_file_bytes(manifest_path.string()), manifest_path);
  if (!manifest.is_object() || manifest.value("format", std::string()) != kManifestFormat)
    throw_error("'", manifest_path.string(), "' is not a loom checkpoint manifest (expected \"format\": \"",
                kManifestFormat, "\")");

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
