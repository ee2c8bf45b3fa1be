#include "loom/ckpt/safetensors_writer.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "loom/ckpt/safetensors.hpp"
#include "loom/core/error.hpp"

namespace loom {

namespace {
// The format's own constants (https://github.com/huggingface/safetensors, "Format"): an 8-byte
// little-endian header length, a header padded with spaces to a multiple of 8, and the
// reserved "__metadata__" entry; as serialize_safetensors writes them.
constexpr size_t kHeaderAlignmentBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";
}  // namespace

WrittenFile write_safetensors_spans(const std::string& path, std::vector<TensorSpans> tensors,
                                    const std::map<std::string, std::string>& metadata) {
  const std::string where = "cannot write '" + path + "'";
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorSpans& a, const TensorSpans& b) { return a.name < b.name; });
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json header_metadata = nlohmann::json::object();
  for (const auto& [key, value] : metadata) {
    if (key.rfind(kSafetensorsCrcKeyPrefix, 0) == 0)
      throw_error(where, ": safetensors metadata key '", key, "' uses the prefix '",
                  kSafetensorsCrcKeyPrefix, "' that loom reserves for checksums");
    header_metadata[key] = value;
  }
  // Each tensor's CRC32 is one pass over its spans; the whole file's follows from them
  // (crc32_combined), without a second pass.
  uint64_t offset = 0;
  std::vector<std::pair<uint32_t, uint64_t>> tensor_crcs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpans& t = tensors[i];
    if (t.name.empty() || t.name == kMetadataKey)
      throw_error(where, ": invalid tensor name '", t.name, "'");
    if (i > 0 && tensors[i - 1].name == t.name)
      throw_error(where, ": tensor '", t.name, "' appears twice");
    uint64_t expected = safetensors_dtype_size_bytes(t.dtype);
    for (int64_t extent : t.shape) expected *= static_cast<uint64_t>(std::max<int64_t>(extent, 0));
    uint64_t bytes = 0;
    uint32_t crc = 0;
    for (const ByteSpan& span : t.spans) {
      crc = crc32_update(crc, span.data, span.bytes);
      bytes += span.bytes;
    }
    if (bytes != expected)
      throw_error(where, ": tensor '", t.name, "' has ", bytes, " bytes, but dtype ", t.dtype,
                  " with shape ", shape_to_string(t.shape), " needs ", expected);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    header_metadata[kSafetensorsCrcKeyPrefix + t.name] = crc32_hex(crc);
    tensor_crcs.emplace_back(crc, bytes);
    offset += bytes;
  }
  if (!header_metadata.empty()) header[kMetadataKey] = header_metadata;
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw_error(where,
                ": cannot encode the header (tensor names and metadata must be UTF-8): ", e.what());
  }
  header_text.append(
      (kHeaderAlignmentBytes - header_text.size() % kHeaderAlignmentBytes) % kHeaderAlignmentBytes,
      ' ');
  uint8_t length[8];
  for (int b = 0; b < 8; ++b)
    length[b] = static_cast<uint8_t>(static_cast<uint64_t>(header_text.size()) >> (8 * b));

  std::vector<ByteSpan> spans = {{length, sizeof length}, {header_text.data(), header_text.size()}};
  for (const TensorSpans& t : tensors) spans.insert(spans.end(), t.spans.begin(), t.spans.end());
  atomic_write_file(path, spans);
  WrittenFile written;
  written.crc32 =
      crc32_update(crc32_update(0, length, sizeof length), header_text.data(), header_text.size());
  written.bytes = sizeof length + header_text.size();
  for (const auto& [crc, bytes] : tensor_crcs) {
    written.crc32 = crc32_combined(written.crc32, crc, bytes);
    written.bytes += bytes;
  }
  return written;
}

}  // namespace loom
