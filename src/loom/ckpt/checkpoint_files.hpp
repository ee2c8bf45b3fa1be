#pragma once
// Checkpoint directory mechanics shared by the single-file and the sharded formats: names,
// the temp-directory-then-rename protocol, the manifest of byte sizes and CRC32s, verified
// reads, `latest`, and pruning. A directory with a manifest is complete; anything else under
// the root is in progress or abandoned and is never loaded.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::ckpt_files {

namespace fs = std::filesystem;

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kManifestFormat = "loom.checkpoint.v1";
inline constexpr const char* kStepPrefix = "step_";
// In-progress and replaced directories carry this marker so no reader mistakes them for a
// finished checkpoint: "step_<N>.tmp-<pid>" and "step_<N>.tmp-replaced-<pid>".
inline constexpr const char* kTempMarker = ".tmp-";
inline constexpr int kJsonIndent = 2;
inline constexpr size_t kMaxStepDigits = 18;  // keeps the parsed step inside int64_t


std::optional<int64_t> parse_step_dir_name(std::string_view name);

struct StepDir {
  int64_t step;
  fs::path path;
};
// Finished checkpoint directories under root (those with a manifest), in no particular order.
std::vector<StepDir> list_step_dirs(const fs::path& root);

std::string dump_json(const nlohmann::json& value, const std::string& what);
nlohmann::json parse_json_file(const std::vector<uint8_t>& bytes, const fs::path& path);

// Removes a half-built checkpoint directory unless the save got far enough to keep it.
class RemoveOnFailure {
 public:
  explicit RemoveOnFailure(fs::path path) : path_(std::move(path)) {}
  ~RemoveOnFailure();
  RemoveOnFailure(const RemoveOnFailure&) = delete;
  RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
  void disarm() { armed_ = false; }

 private:
  fs::path path_;
  bool armed_ = true;
};

// "<root>/step_<N>.tmp-<token>", created empty (a leftover of that name is removed first);
// the root is created if missing. `context` prefixes every error.
fs::path create_temp_dir(const fs::path& root, int64_t step, const std::string& token, const std::string& context);

struct FileRecord {
  std::string name;
  uint64_t bytes = 0;
  std::string crc32;
};
FileRecord write_recorded(const fs::path& dir, const std::string& name, const std::string& bytes);
// Written last: a directory with a manifest is complete.
void write_manifest(const fs::path& dir, int64_t step, const std::vector<FileRecord>& files);

// Renames a finished temp directory to <root>/step_<N>, points `latest` at it, and prunes to
// keep_last (0 keeps all). Returns the final directory.
std::string install_checkpoint(const fs::path& temp_dir, const fs::path& root, int64_t step, int keep_last);

// The manifest of a checkpoint directory, checked for the loom format: an object with
// "format": "loom.checkpoint.v1", an integer "step" and "files", an object whose every record
// is {"bytes": unsigned, "crc32": 8 hex digits} under a plain file name (no '/', not "." or "..").
nlohmann::json read_manifest(const fs::path& dir);
// The same from the manifest's bytes; `path` names it in errors.
nlohmann::json parse_manifest(const std::vector<uint8_t>& bytes, const fs::path& path);
// A file's bytes, verified against its manifest record (size and CRC32).
std::vector<uint8_t> read_verified(const fs::path& dir, const nlohmann::json& manifest, const char* name);
// The check alone, on bytes already read: `dir / name` names the file in errors.
void verify_recorded(const std::vector<uint8_t>& bytes, const fs::path& dir, const nlohmann::json& manifest,
                     const char* name);
fs::path resolve_checkpoint_dir(const std::string& dir_or_root);

// Removes what a killed save leaves under `root`: "step_<N>.tmp-*" directories and step_<N>
// directories without a manifest (never loaded, see list_step_dirs). Returns what it removed;
// a root that does not exist holds nothing. Only one process may call it, before any save.
std::vector<fs::path> remove_partial_checkpoints(const fs::path& root);

}  // namespace loom::ckpt_files
