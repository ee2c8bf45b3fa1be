#pragma once
// The safetensors format (https://github.com/huggingface/safetensors, "Format" section):
//   8 bytes   little-endian u64 N, the header length
//   N bytes   JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
//   rest      tensor data; offsets are relative to the start of this region
// Tensors are packed without gaps, as the reference loader requires. loom additionally stores
// a CRC32 of each tensor under "__metadata__" key "loom.crc32.<name>" so bit rot is caught on
// load; files from other writers, without those keys, still load.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom {

// dtype is one of "F32", "BF16", "I32", "I64"; bytes are little-endian, row-major.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct SafetensorsFile {
  std::string path;  // where it was read from, so later errors can name the file
  std::map<std::string, std::string> metadata;  // without loom's own crc keys
  std::vector<SafetensorsEntry> entries;        // in data order

  // Throws loom::Error naming the file and the missing tensor.
  const SafetensorsEntry& at(const std::string& name) const;
  const SafetensorsEntry* find(const std::string& name) const;
};

// Metadata key prefix under which write_safetensors stores each tensor's CRC32 (8 hex digits).
inline constexpr const char* kSafetensorsCrcKeyPrefix = "loom.crc32.";

// Bytes per element of a safetensors dtype string; throws naming the dtype if unsupported.
size_t safetensors_dtype_size_bytes(const std::string& dtype);

// Serializes entries (sorted by name, packed) with metadata plus crc keys. Throws if an
// entry's byte count disagrees with its dtype and shape, or names collide.
std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata = {});
// Parses and verifies a whole file held in memory; `source` names it in errors.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& source);

// A file's layout from its header alone, for reading tensors by byte range (pread) without
// reading the file: entries in data order, at absolute file offsets [begin, end), with the
// CRC32 loom stored for each ("" when the writer stored none).
struct SafetensorsLayout {
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
    std::string crc32;
  };
  uint64_t data_start = 0;                      // 8 + the header length
  std::map<std::string, std::string> metadata;  // with loom's crc keys
  std::vector<Entry> entries;
  const Entry* find(const std::string& name) const;
};
// The header length from the file's first 8 bytes, checked against the file's size `size`.
uint64_t safetensors_header_bytes(const uint8_t* first_8_bytes, uint64_t size,
                                  const std::string& source);
// The layout from the header's `header_bytes` bytes (those after the first 8), checked as
// parse_safetensors checks it: packed, inside a file of `size` bytes.
SafetensorsLayout parse_safetensors_layout(const uint8_t* header, uint64_t header_bytes,
                                           uint64_t size, const std::string& source);
// Checks one entry's bytes (end - begin of them) against its stored CRC32; the error names the
// file and tensor.
void verify_safetensors_crc(const SafetensorsLayout::Entry& entry, const uint8_t* bytes,
                            const std::string& source);

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});
SafetensorsFile read_safetensors(const std::string& path);

// Tensor bridges: loom tensors are F32 or BF16.
SafetensorsEntry entry_from_tensor(const std::string& name, const Tensor& tensor);
Tensor tensor_from_entry(const SafetensorsEntry& entry, MemCategory category);

// zlib CRC32 over any length (zlib takes 32-bit lengths, so large buffers go in chunks).
uint32_t crc32_of(const void* data, size_t bytes);
// The CRC32 of bytes that follow those `running` covers (crc32_of = crc32_update(0, ...)).
uint32_t crc32_update(uint32_t running, const void* data, size_t bytes);
// The CRC32 of two byte runs one after the other, from theirs (zlib's crc32_combine).
uint32_t crc32_combined(uint32_t first, uint32_t second, uint64_t second_bytes);
std::string crc32_hex(uint32_t crc);  // 8 lowercase hex digits

}  // namespace loom
