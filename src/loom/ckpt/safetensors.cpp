#include "loom/ckpt/safetensors.hpp"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/core/error.hpp"

namespace loom {

// Tensor bytes are copied straight between memory and file, so the host must match the
// format's little-endian byte order.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

constexpr size_t kHeaderLengthBytes = 8;
// The reference implementation refuses headers above 100 MB (safetensors MAX_HEADER_SIZE);
// a larger length is a corrupt prefix, not a real header, so we refuse it before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The reference writer pads the header with spaces so the data region starts 8-byte aligned.
constexpr size_t kHeaderAlignmentBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";

bool is_crc_key(const std::string& key) { return key.rfind(kSafetensorsCrcKeyPrefix, 0) == 0; }

// Element count of a shape, or an error when a dimension is negative or the product overflows.
uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& context) {
  uint64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) throw_error(context, ": negative dimension in shape ", shape_to_string(shape));
    const auto udim = static_cast<uint64_t>(dim);
    if (udim != 0 && numel > std::numeric_limits<uint64_t>::max() / udim)
      throw_error(context, ": shape ", shape_to_string(shape), " has too many elements");
    numel *= udim;
  }
  return numel;
}

uint64_t expected_byte_count(const std::string& dtype, const std::vector<int64_t>& shape,
                             const std::string& context) {
  const uint64_t numel = checked_numel(shape, context);
  const uint64_t element_bytes = safetensors_dtype_size_bytes(dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / element_bytes)
    throw_error(context, ": shape ", shape_to_string(shape), " has too many bytes");
  return numel * element_bytes;
}

uint64_t read_le_u64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return value;
}

void append_le_u64(std::vector<uint8_t>& out, uint64_t value) {
  for (size_t i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

// What the header says about one tensor, checked for form but not yet against the data.
struct HeaderTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

HeaderTensor parse_header_tensor(const std::string& name, const json& info, const std::string& where) {
  const std::string context = where + ": tensor '" + name + "'";
  if (!info.is_object()) throw_error(context, ": header entry is ", info.type_name(), ", expected an object");
  HeaderTensor tensor;
  tensor.name = name;

  const auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) throw_error(context, ": missing string field 'dtype'");
  tensor.dtype = dtype->get<std::string>();
  try {
    safetensors_dtype_size_bytes(tensor.dtype);
  } catch (const Error& e) {
    throw_error(context, ": ", e.what());
  }

  const auto shape = info.find("shape");
  if (shape == info.end() || !shape->is_array()) throw_error(context, ": missing array field 'shape'");
  for (const json& dim : *shape) {
    if (!dim.is_number_unsigned())
      throw_error(context, ": shape ", shape->dump(), " must hold non-negative integers");
    const auto value = dim.get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw_error(context, ": dimension ", value, " is too large");
    tensor.shape.push_back(static_cast<int64_t>(value));
  }

  const auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    throw_error(context, ": 'data_offsets' must be [begin, end] with non-negative integers");
  tensor.begin = (*offsets)[0].get<uint64_t>();
  tensor.end = (*offsets)[1].get<uint64_t>();
  if (tensor.end < tensor.begin)
    throw_error(context, ": data_offsets [", tensor.begin, ", ", tensor.end, "] end before they begin");

  const uint64_t expected = expected_byte_count(tensor.dtype, tensor.shape, context);
  if (tensor.end - tensor.begin != expected)
    throw_error(context, ": data_offsets [", tensor.begin, ", ", tensor.end, "] span ", tensor.end - tensor.begin,
                " bytes, but dtype ", tensor.dtype, " with shape ", shape_to_string(tensor.shape), " needs ",
                expected);
  return tensor;
}

std::map<std::string, std::string> parse_metadata(const json& metadata, const std::string& where) {
  std::map<std::string, std::string> out;
  if (metadata.is_null()) return out;
  if (!metadata.is_object())
    throw_error(where, ": '__metadata__' is ", metadata.type_name(), ", expected an object of strings");
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string())
      throw_error(where, ": '__metadata__' key '", key, "' is ", value.type_name(), ", expected a string");
    out[key] = value.get<std::string>();
  }
  return out;
}

// Packed means: sorted by offset, each tensor starts where the previous ended, the first at 0
// and the last ends exactly at the end of the file.
void check_packed_layout(std::vector<HeaderTensor>& tensors, uint64_t data_bytes, uint64_t header_bytes,
                         const std::string& where) {
  std::sort(tensors.begin(), tensors.end(), [](const HeaderTensor& a, const HeaderTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t previous_end = 0;
  const HeaderTensor* previous = nullptr;
  for (const HeaderTensor& tensor : tensors) {
    if (tensor.begin < previous_end)
      throw_error(where, ": tensor '", tensor.name, "' data [", tensor.begin, ", ", tensor.end,
                  ") overlaps tensor '", previous->name, "' [", previous->begin, ", ", previous->end, ")");
    if (tensor.begin > previous_end)
      throw_error(where, ": tensor '", tensor.name, "' starts at data offset ", tensor.begin,
                  ", leaving a gap after offset ", previous_end, " (safetensors data must be packed)");
    if (tensor.end > data_bytes)
      throw_error(where, ": file is truncated: tensor '", tensor.name, "' needs data bytes [", tensor.begin, ", ",
                  tensor.end, ") but the file holds only ", data_bytes, " data bytes (file is ",
                  kHeaderLengthBytes + header_bytes + data_bytes, " bytes)");
    previous_end = tensor.end;
    previous = &tensor;
  }
  if (previous_end != data_bytes)
    throw_error(where, ": ", data_bytes - previous_end, " unexpected bytes after the last tensor's data (tensors end at ",
                "data offset ", previous_end, ", file data region is ", data_bytes, " bytes)");
}

void verify_crcs(const std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata,
                 const std::string& where) {
  std::set<std::string> names;
  for (const SafetensorsEntry& entry : entries) names.insert(entry.name);
  for (const auto& [key, value] : metadata) {
    if (!is_crc_key(key)) continue;
    const std::string name = key.substr(std::strlen(kSafetensorsCrcKeyPrefix));
    if (!names.count(name)) throw_error(where, ": metadata key '", key, "' is a checksum for a tensor the file lacks");
  }
  for (const SafetensorsEntry& entry : entries) {
    const auto stored = metadata.find(kSafetensorsCrcKeyPrefix + entry.name);
    if (stored == metadata.end()) continue;  // written by another tool: nothing to verify against
    const std::string computed = crc32_hex(crc32_of(entry.bytes.data(), entry.bytes.size()));
    if (stored->second != computed)
      throw_error(where, ": tensor '", entry.name, "' failed its CRC32 check (stored ", stored->second,
                  ", computed ", computed, "): the file is corrupt");
  }
}

}  // namespace

size_t safetensors_dtype_size_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16") return 2;
  if (dtype == "I64") return 8;
  throw_error("unsupported safetensors dtype '", dtype, "', expected one of F32, BF16, I32, I64");
}

uint32_t crc32_of(const void* data, size_t bytes) { return crc32_update(0, data, bytes); }

uint32_t crc32_combined(uint32_t first, uint32_t second, uint64_t second_bytes) {
  return static_cast<uint32_t>(::crc32_combine(first, second, static_cast<z_off_t>(second_bytes)));
}

uint32_t crc32_update(uint32_t running, const void* data, size_t bytes) {
  constexpr size_t kChunkBytes = size_t{1} << 30;  // zlib's crc32 takes a 32-bit length
  uLong crc = running;
  const auto* cursor = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const size_t chunk = std::min(bytes, kChunkBytes);
    crc = ::crc32(crc, cursor, static_cast<uInt>(chunk));
    cursor += chunk;
    bytes -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string crc32_hex(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& entry : entries)
    if (entry.name == name) return &entry;
  return nullptr;
}

const SafetensorsEntry& SafetensorsFile::at(const std::string& name) const {
  if (const SafetensorsEntry* entry = find(name)) return *entry;
  throw_error("safetensors '", path, "': no tensor named '", name, "' (file has ", entries.size(), " tensors)");
}

std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsEntry*> sorted;
  for (const SafetensorsEntry& entry : entries) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });

  json header = json::object();
  json header_metadata = json::object();
  for (const auto& [key, value] : metadata) {
    if (is_crc_key(key))
      throw_error("safetensors metadata key '", key, "' uses the prefix '", kSafetensorsCrcKeyPrefix,
                  "' that loom reserves for checksums");
    header_metadata[key] = value;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const SafetensorsEntry& entry = *sorted[i];
    const std::string context = "safetensors tensor '" + entry.name + "'";
    if (entry.name.empty() || entry.name == kMetadataKey)
      throw_error("safetensors: invalid tensor name '", entry.name, "'");
    if (i > 0 && sorted[i - 1]->name == entry.name) throw_error(context, ": name appears twice");
    const uint64_t expected = expected_byte_count(entry.dtype, entry.shape, context);
    if (entry.bytes.size() != expected)
      throw_error(context, ": has ", entry.bytes.size(), " bytes, but dtype ", entry.dtype, " with shape ",
                  shape_to_string(entry.shape), " needs ", expected);
    header[entry.name] = {{"dtype", entry.dtype},
                          {"shape", entry.shape},
                          {"data_offsets", {offset, offset + expected}}};
    header_metadata[kSafetensorsCrcKeyPrefix + entry.name] = crc32_hex(crc32_of(entry.bytes.data(), expected));
    offset += expected;
  }
  if (!header_metadata.empty()) header[kMetadataKey] = header_metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    throw_error("safetensors: cannot encode header (tensor names and metadata must be UTF-8): ", e.what());
  }
  header_text.append((kHeaderAlignmentBytes - header_text.size() % kHeaderAlignmentBytes) % kHeaderAlignmentBytes,
                     ' ');

  std::vector<uint8_t> out;
  out.reserve(kHeaderLengthBytes + header_text.size() + offset);
  append_le_u64(out, header_text.size());
  out.insert(out.end(), header_text.begin(), header_text.end());
  for (const SafetensorsEntry* entry : sorted) out.insert(out.end(), entry->bytes.begin(), entry->bytes.end());
  return out;
}

uint64_t safetensors_header_bytes(const uint8_t* data, uint64_t size, const std::string& source) {
  const std::string where = "safetensors '" + source + "'";
  if (size < kHeaderLengthBytes)
    throw_error(where, ": file is ", size, " bytes, shorter than the 8-byte header length; not a safetensors file");
  const uint64_t header_bytes = read_le_u64(data);
  if (header_bytes > size - kHeaderLengthBytes)
    throw_error(where, ": header length ", header_bytes, " exceeds the file size of ", size,
                " bytes; the file is truncated or not a safetensors file");
  if (header_bytes > kMaxHeaderBytes)
    throw_error(where, ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes,
                "-byte limit of the reference loader; not a safetensors file");
  return header_bytes;
}

SafetensorsLayout parse_safetensors_layout(const uint8_t* header_data, uint64_t header_bytes,
                                           uint64_t size, const std::string& source) {
  const std::string where = "safetensors '" + source + "'";
  const char* header_begin = reinterpret_cast<const char*>(header_data);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_bytes);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past 64 bits
    throw_error(where, ": header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) throw_error(where, ": header is ", header.type_name(), ", expected a JSON object");

  SafetensorsLayout layout;
  layout.data_start = kHeaderLengthBytes + header_bytes;
  std::vector<HeaderTensor> tensors;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey)
      layout.metadata = parse_metadata(info, where);
    else
      tensors.push_back(parse_header_tensor(name, info, where));
  }
  check_packed_layout(tensors, size - layout.data_start, header_bytes, where);
  std::set<std::string> names;
  for (const HeaderTensor& tensor : tensors) names.insert(tensor.name);
  for (const auto& [key, value] : layout.metadata)
    if (is_crc_key(key) && !names.count(key.substr(std::strlen(kSafetensorsCrcKeyPrefix))))
      throw_error(where, ": metadata key '", key, "' is a checksum for a tensor the file lacks");
  for (HeaderTensor& tensor : tensors) {
    const auto crc = layout.metadata.find(kSafetensorsCrcKeyPrefix + tensor.name);
    layout.entries.push_back({std::move(tensor.name), std::move(tensor.dtype),
                              std::move(tensor.shape), layout.data_start + tensor.begin,
                              layout.data_start + tensor.end,
                              crc == layout.metadata.end() ? std::string() : crc->second});
  }
  return layout;
}

const SafetensorsLayout::Entry* SafetensorsLayout::find(const std::string& name) const {
  for (const Entry& entry : entries)
    if (entry.name == name) return &entry;
  return nullptr;
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& source) {
  const std::string where = "safetensors '" + source + "'";
  const uint64_t header_bytes = safetensors_header_bytes(data, size, source);
  SafetensorsLayout layout =
      parse_safetensors_layout(data + kHeaderLengthBytes, header_bytes, size, source);
  SafetensorsFile file;
  file.path = source;
  for (SafetensorsLayout::Entry& tensor : layout.entries) {
    SafetensorsEntry entry;
    entry.name = std::move(tensor.name);
    entry.dtype = std::move(tensor.dtype);
    entry.shape = std::move(tensor.shape);
    entry.bytes.assign(data + tensor.begin, data + tensor.end);
    file.entries.push_back(std::move(entry));
  }
  verify_crcs(file.entries, layout.metadata, where);
  for (auto& [key, value] : layout.metadata)
    if (!is_crc_key(key)) file.metadata[key] = value;
  return file;
}

void verify_safetensors_crc(const SafetensorsLayout::Entry& entry, const uint8_t* bytes,
                            const std::string& source) {
  if (entry.crc32.empty()) return;  // written by another tool: nothing to verify against
  const std::string computed = crc32_hex(crc32_of(bytes, entry.end - entry.begin));
  if (entry.crc32 != computed)
    throw_error("safetensors '", source, "': tensor '", entry.name,
                "' failed its CRC32 check (stored ", entry.crc32, ", computed ", computed,
                "): the file is corrupt");
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes;
  try {
    bytes = serialize_safetensors(entries, metadata);
  } catch (const Error& e) {
    throw_error("cannot write '", path, "': ", e.what());
  }
  atomic_write_file(path, bytes.data(), bytes.size());
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return parse_safetensors(bytes.data(), bytes.size(), path);
}

SafetensorsEntry entry_from_tensor(const std::string& name, const Tensor& tensor) {
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype = tensor.dtype() == DType::F32 ? "F32" : "BF16";
  entry.shape = tensor.shape();
  const auto* bytes = static_cast<const uint8_t*>(tensor.raw());
  entry.bytes.assign(bytes, bytes + tensor.nbytes());
  return entry;
}

Tensor tensor_from_entry(const SafetensorsEntry& entry, MemCategory category) {
  DType dtype;
  if (entry.dtype == "F32")
    dtype = DType::F32;
  else if (entry.dtype == "BF16")
    dtype = DType::BF16;
  else
    throw_error("tensor '", entry.name, "' has dtype ", entry.dtype, "; loom tensors are F32 or BF16");
  const std::string context = "tensor '" + entry.name + "'";
  const uint64_t expected = expected_byte_count(entry.dtype, entry.shape, context);
  if (entry.bytes.size() != expected)
    throw_error(context, ": has ", entry.bytes.size(), " bytes, but shape ", shape_to_string(entry.shape),
                " needs ", expected);
  Tensor tensor = Tensor::empty(entry.shape, dtype, category);
  if (expected > 0) std::memcpy(tensor.raw(), entry.bytes.data(), expected);
  return tensor;
}

}  // namespace loom
