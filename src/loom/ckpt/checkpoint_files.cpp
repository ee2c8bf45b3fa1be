#include "loom/ckpt/checkpoint_files.hpp"

#include <unistd.h>

#include <algorithm>
#include <system_error>
#include <utility>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/core/error.hpp"

namespace loom::ckpt_files {

using json = nlohmann::json;

namespace {

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

}  // namespace

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

RemoveOnFailure::~RemoveOnFailure() {
  std::error_code ignored;  // already unwinding from the real error; that one is reported
  if (armed_) fs::remove_all(path_, ignored);
}

fs::path create_temp_dir(const fs::path& root, int64_t step, const std::string& token, const std::string& context) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (!fs::is_directory(root))
    throw_error(context, ": the root is not a directory", ec ? " (" + ec.message() + ")" : std::string());
  const fs::path temp_dir = root / (checkpoint_dir_name(step) + kTempMarker + token);
  fs::remove_all(temp_dir, ec);  // a leftover from an earlier crash of a process with our token
  if (!fs::create_directory(temp_dir, ec) || ec)
    throw_error(context, ": cannot create '", temp_dir.string(), "': ", ec ? ec.message() : "already exists");
  return temp_dir;
}

FileRecord write_recorded(const fs::path& dir, const std::string& name, const std::string& bytes) {
  atomic_write_file((dir / name).string(), bytes);
  return {name, bytes.size(), crc32_hex(crc32_of(bytes.data(), bytes.size()))};
}

void write_manifest(const fs::path& dir, int64_t step, const std::vector<FileRecord>& files) {
  json manifest = {{"format", kManifestFormat}, {"step", step}, {"files", json::object()}};
  for (const FileRecord& file : files) manifest["files"][file.name] = {{"bytes", file.bytes}, {"crc32", file.crc32}};
  atomic_write_file((dir / kManifestFile).string(), dump_json(manifest, "manifest"));
}

// Keeps the newest keep_last checkpoints by step, plus the one just written.
static void prune_checkpoints(const fs::path& root, int keep_last, const fs::path& just_written) {
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

std::string install_checkpoint(const fs::path& temp_dir, const fs::path& root, int64_t step, int keep_last) {
  const std::string dir_name = checkpoint_dir_name(step);
  const fs::path final_dir = root / dir_name;
  const std::optional<fs::path> replaced = install_directory(temp_dir, final_dir);
  atomic_write_file((root / kLatestFile).string(), dir_name + "\n");
  std::error_code ec;
  if (replaced) {
    fs::remove_all(*replaced, ec);
    if (ec)
      throw_error("checkpoint '", final_dir.string(), "' was saved, but removing the replaced copy '",
                  replaced->string(), "' failed: ", ec.message());
  }
  if (keep_last > 0) prune_checkpoints(root, keep_last, final_dir);
  return final_dir.string();
}

json read_manifest(const fs::path& dir) {
  const fs::path manifest_path = dir / kManifestFile;
  return parse_manifest(read_file_bytes(manifest_path.string()), manifest_path);
}

json parse_manifest(const std::vector<uint8_t>& bytes, const fs::path& path) {
  const json manifest = parse_json_file(bytes, path);
  if (!manifest.is_object() || !manifest.contains("format") || !manifest["format"].is_string() ||
      manifest["format"].get<std::string>() != kManifestFormat)
    throw_error("'", path.string(), "' is not a loom checkpoint manifest (expected \"format\": \"",
                kManifestFormat, "\")");
  if (!manifest.contains("step") || !manifest["step"].is_number_integer())
    throw_error("'", path.string(), "': \"step\" is missing or not an integer");
  if (!manifest.contains("files") || !manifest["files"].is_object())
    throw_error("'", path.string(), "': \"files\" is missing or not an object of file records");
  for (const auto& [name, record] : manifest["files"].items()) {
    // A record names a file inside the checkpoint directory, never a path out of it.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      throw_error("'", path.string(), "' lists the file '", name, "', which is not a plain file name");
    if (!record.is_object() || !record.contains("bytes") || !record["bytes"].is_number_unsigned() ||
        !record.contains("crc32") || !record["crc32"].is_string() || record["crc32"].get<std::string>().size() != 8)
      throw_error("'", path.string(), "' has no valid record (bytes, crc32) for '", name, "'");
  }
  return manifest;
}

std::vector<uint8_t> read_verified(const fs::path& dir, const json& manifest, const char* name) {
  const fs::path path = dir / name;
  if (!manifest.contains("files") || !manifest["files"].is_object() || !manifest["files"].contains(name))
    throw_error("'", (dir / kManifestFile).string(), "' has no valid record (bytes, crc32) for '", name, "'");
  const std::vector<uint8_t> bytes = read_file_bytes(path.string());
  verify_recorded(bytes, dir, manifest, name);
  return bytes;
}

void verify_recorded(const std::vector<uint8_t>& bytes, const fs::path& dir, const json& manifest, const char* name) {
  const fs::path path = dir / name;
  const std::string manifest_path = (dir / kManifestFile).string();
  const json* record = nullptr;
  if (manifest.contains("files") && manifest["files"].is_object() && manifest["files"].contains(name))
    record = &manifest["files"][name];
  if (!record || !record->is_object() || !record->contains("bytes") || !(*record)["bytes"].is_number_unsigned() ||
      !record->contains("crc32") || !(*record)["crc32"].is_string())
    throw_error("'", manifest_path, "' has no valid record (bytes, crc32) for '", name, "'");
  const auto expected_bytes = (*record)["bytes"].get<uint64_t>();
  if (bytes.size() != expected_bytes)
    throw_error("checkpoint file '", path.string(), "' is ", bytes.size(), " bytes, but the manifest records ",
                expected_bytes, ": the file is truncated or was modified");
  const std::string crc = crc32_hex(crc32_of(bytes.data(), bytes.size()));
  const auto expected_crc = (*record)["crc32"].get<std::string>();
  if (crc != expected_crc)
    throw_error("checkpoint file '", path.string(), "' has CRC32 ", crc, ", but the manifest records ", expected_crc,
                ": the file is corrupt");
}

json parse_json_file(const std::vector<uint8_t>& bytes, const fs::path& path) {
  try {
    return json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past 64 bits
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

std::vector<fs::path> remove_partial_checkpoints(const fs::path& root) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kStepPrefix, 0) != 0 || !entry.is_directory(ec)) continue;
    const bool temp = name.find(kTempMarker) != std::string::npos;
    const bool unfinished =
        parse_step_dir_name(name) && !fs::exists(entry.path() / kManifestFile, ec);
    if (temp || unfinished) removed.push_back(entry.path());
  }
  if (ec) throw_error("cannot list checkpoint root '", root.string(), "': ", ec.message());
  std::sort(removed.begin(), removed.end());
  for (const fs::path& path : removed) {
    fs::remove_all(path, ec);
    if (ec)
      throw_error("cannot remove the partial checkpoint '", path.string(), "': ", ec.message());
  }
  return removed;
}

}  // namespace loom::ckpt_files
