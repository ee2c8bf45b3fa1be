// libFuzzer target: a checkpoint directory (manifest.json, index.json, config.json,
// trainer_state.json and the safetensors files) through CheckpointReader::from_files, which the
// directory reader also uses, then every tensor read back whole.
// Input: one mode byte, then files as [name length: 1 byte][name][size: 4 bytes LE][bytes].
// Mode bit 0 set: the harness rewrites the manifest's records to the files' true sizes and
// CRC32s, so that mutations reach the index and the files behind the manifest's checks;
// clear: the manifest is taken as it is. Malformed input must end in a loom::Error; anything
// else is a bug.
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/ckpt/safetensors.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/core/error.hpp"

namespace {
constexpr int64_t kMaxReadElements = int64_t{1} << 20;

std::map<std::string, std::vector<uint8_t>> unpack(const uint8_t* data, size_t size) {
  std::map<std::string, std::vector<uint8_t>> files;
  size_t at = 1;
  while (at < size) {
    const size_t name_length = data[at++];
    if (size - at < name_length + 4) break;
    std::string name(reinterpret_cast<const char*>(data + at), name_length);
    at += name_length;
    const uint32_t length =
        static_cast<uint32_t>(data[at]) | static_cast<uint32_t>(data[at + 1]) << 8 |
        static_cast<uint32_t>(data[at + 2]) << 16 | static_cast<uint32_t>(data[at + 3]) << 24;
    at += 4;
    const size_t take = std::min<size_t>(length, size - at);
    files[name].assign(data + at, data + at + take);
    at += take;
  }
  return files;
}

void fix_manifest(std::map<std::string, std::vector<uint8_t>>& files) {
  auto manifest_file = files.find("manifest.json");
  if (manifest_file == files.end()) return;
  nlohmann::json manifest = nlohmann::json::parse(manifest_file->second, nullptr, false);
  if (!manifest.is_object()) return;
  nlohmann::json records = nlohmann::json::object();
  for (const auto& [name, bytes] : files)
    if (name != "manifest.json")
      records[name] = {{"bytes", bytes.size()},
                       {"crc32", loom::crc32_hex(loom::crc32_of(bytes.data(), bytes.size()))}};
  manifest["files"] = records;
  const std::string text = manifest.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  manifest_file->second.assign(text.begin(), text.end());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::map<std::string, std::vector<uint8_t>> files = unpack(data, size);
  if (data[0] & 1) fix_manifest(files);
  try {
    const loom::CheckpointReader reader = loom::CheckpointReader::from_files("fuzz_ckpt", files);
    std::vector<float> values;
    for (const std::string& name : reader.tensor_names()) {
      const loom::Shape shape = reader.stored_shape(name);
      const int64_t numel = loom::shape_numel(shape);
      if (numel > kMaxReadElements) continue;
      values.resize(static_cast<size_t>(numel));
      reader.read({name, shape, false}, 0, numel, values.data());
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
