#include "loom/ckpt/sharded_checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/ckpt/safetensors_writer.hpp"
#include "loom/core/error.hpp"

namespace loom {

using json = nlohmann::json;
using namespace ckpt_files;

namespace {

constexpr const char* kIndexFile = "index.json";
constexpr const char* kIndexFormat = "loom.sharded.v1";

std::string description_file_name(int rank, int world) {
  const std::string shard = shard_file_name(rank, world);
  return shard.substr(0, shard.size() - std::string(".safetensors").size()) + ".json";
}

json read_json(const fs::path& path) { return parse_json_file(read_file_bytes(path.string()), path); }

}  // namespace

std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}

uint64_t write_checkpoint_shard(const fs::path& temp_dir, int rank, int world,
                                const std::vector<ShardSlice>& slices,
                                const AfterFileHook& after_file) {
  // One entry per tensor: a rank may hold several pieces of one tensor (a tensor-parallel
  // column shard is one run per row), which go into the entry one after another, written
  // straight from the slices' memory; each piece's "offset" says where it starts in the entry.
  std::vector<TensorSpans> entries;
  std::vector<int64_t> entry_elements;
  std::map<std::string, size_t> entry_of;
  json pieces = json::array();
  for (const ShardSlice& s : slices) {
    auto [it, inserted] = entry_of.emplace(s.tensor, entries.size());
    if (inserted) {
      entries.push_back({s.tensor, "F32", {}, {}});
      entry_elements.push_back(0);
    }
    TensorSpans& entry = entries[it->second];
    int64_t& elements = entry_elements[it->second];
    if (s.count > 0) entry.spans.push_back({s.data, static_cast<size_t>(s.count) * sizeof(float)});
    pieces.push_back({{"tensor", s.tensor},
                      {"shape", s.shape},
                      {"start", s.start},
                      {"count", s.count},
                      {"offset", elements}});
    elements += s.count;
    entry.shape = {elements};
  }
  const std::string name = shard_file_name(rank, world);
  const WrittenFile written =
      write_safetensors_spans((temp_dir / name).string(), std::move(entries));
  if (after_file) after_file(name);
  const json description = {{"file", name},
                            {"bytes", written.bytes},
                            {"crc32", crc32_hex(written.crc32)},
                            {"pieces", pieces}};
  atomic_write_file((temp_dir / description_file_name(rank, world)).string(), dump_json(description, "shard description"));
  return written.bytes;
}

std::string finish_sharded_checkpoint(const fs::path& temp_dir, const fs::path& root, int64_t step, int world,
                                      const ModelConfig& config, const json& trainer_state, int keep_last) {
  RemoveOnFailure cleanup(temp_dir);
  std::vector<FileRecord> records;
  std::map<std::string, json> tensors;  // name -> {"shape", "pieces"}
  for (int rank = 0; rank < world; ++rank) {
    const fs::path path = temp_dir / description_file_name(rank, world);
    if (!fs::exists(path)) throw_error("sharded checkpoint: rank ", rank, " wrote no shard ('", path.string(), "' is missing)");
    const json d = read_json(path);
    records.push_back({d.at("file").get<std::string>(), d.at("bytes").get<uint64_t>(), d.at("crc32").get<std::string>()});
    for (const json& p : d.at("pieces")) {
      json& t = tensors[p.at("tensor").get<std::string>()];
      if (t.is_null()) t = {{"shape", p.at("shape")}, {"pieces", json::array()}};
      if (t["shape"] != p.at("shape"))
        throw_error("sharded checkpoint: tensor '", p.at("tensor").get<std::string>(), "' has shape ",
                    t["shape"].dump(), " on one rank and ", p.at("shape").dump(), " on rank ", rank);
      t["pieces"].push_back({{"file", records.back().name}, {"start", p.at("start")}, {"count", p.at("count")},
                             {"offset", p.value("offset", int64_t{0})}});
    }
  }
  // Every element of every tensor must be in exactly one piece, or the layout is broken.
  for (auto& [name, t] : tensors) {
    std::vector<json> pieces(t["pieces"].begin(), t["pieces"].end());
    std::sort(pieces.begin(), pieces.end(), [](const json& a, const json& b) { return a["start"] < b["start"]; });
    int64_t covered = 0;
    for (const json& p : pieces) {
      if (p["start"].get<int64_t>() != covered)
        throw_error("sharded checkpoint: tensor '", name, "' has a ", p["start"].get<int64_t>() < covered ? "overlap" : "gap",
                    " at element ", covered);
      covered += p["count"].get<int64_t>();
    }
    if (covered != shape_numel(t["shape"].get<Shape>()))
      throw_error("sharded checkpoint: tensor '", name, "' covers ", covered, " of ", shape_numel(t["shape"].get<Shape>()),
                  " elements");
    t["pieces"] = pieces;
  }
  for (int rank = 0; rank < world; ++rank) fs::remove(temp_dir / description_file_name(rank, world));
  const json index = {{"format", kIndexFormat}, {"world_size", world}, {"tensors", tensors}};
  records.push_back(write_recorded(temp_dir, kIndexFile, dump_json(index, "index")));
  records.push_back(write_recorded(temp_dir, kConfigFile, dump_json(hf_config_json(config), "config.json")));
  records.push_back(write_recorded(temp_dir, kTrainerStateFile, dump_json(trainer_state, "trainer_state")));
  write_manifest(temp_dir, step, records);
  const std::string final_dir = install_checkpoint(temp_dir, root, step, keep_last);
  cleanup.disarm();
  return final_dir;
}

// ---- reading ----------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const std::string& dir_or_root) {
  const fs::path dir = resolve_checkpoint_dir(dir_or_root);
  load(
      dir, [&](const std::string& name) { return read_file_bytes((dir / name).string()); }, true);
}

CheckpointReader CheckpointReader::from_files(const std::string& dir,
                                              const std::map<std::string, std::vector<uint8_t>>& files) {
  CheckpointReader reader;
  reader.load(dir, [&](const std::string& name) {
    const auto it = files.find(name);
    if (it == files.end()) throw_error("cannot open '", (fs::path(dir) / name).string(), "': no such file");
    return it->second;
  });
  return reader;
}

void CheckpointReader::open_ranged_shard(const fs::path& dir, const std::string& name,
                                         const json& manifest) {
  auto file = std::make_unique<RangedFile>((dir / name).string());
  const uint64_t recorded = manifest["files"][name]["bytes"].get<uint64_t>();
  if (file->size() != recorded)
    throw_error("checkpoint file '", file->path(), "' is ", file->size(),
                " bytes, but the manifest records ", recorded,
                ": the file is truncated or was modified");
  const std::vector<uint8_t> length = file->read(0, std::min<uint64_t>(8, file->size()));
  const uint64_t header_bytes = safetensors_header_bytes(length.data(), file->size(), file->path());
  const std::vector<uint8_t> header = file->read(8, header_bytes);
  const SafetensorsLayout layout =
      parse_safetensors_layout(header.data(), header_bytes, file->size(), file->path());
  std::map<std::string, RangedEntry>& entries = ranged_entries_[name];
  for (const SafetensorsLayout::Entry& entry : layout.entries)
    entries.emplace(entry.name, RangedEntry{file.get(), entry, {}, false});
  ranged_files_.push_back(std::move(file));
}

void CheckpointReader::load(
    const fs::path& dir, const std::function<std::vector<uint8_t>(const std::string&)>& read_file,
    bool ranged) {
  dir_ = dir.string();
  const json manifest = parse_manifest(read_file(kManifestFile), dir / kManifestFile);
  sharded_ = manifest["files"].contains(kIndexFile);
  std::map<std::string, std::vector<uint8_t>> verified;  // all checked before parsing
  for (const auto& [name, record] : manifest["files"].items()) {
    if (ranged && sharded_ && name.rfind("shard-", 0) == 0) {
      open_ranged_shard(dir, name, manifest);
      continue;
    }
    std::vector<uint8_t> bytes = read_file(name);
    verify_recorded(bytes, dir, manifest, name.c_str());
    verified[name] = std::move(bytes);
  }
  auto bytes_of = [&](const std::string& name) -> const std::vector<uint8_t>& {
    const auto it = verified.find(name);
    if (it == verified.end()) throw_error("checkpoint '", dir_, "': the manifest lists no '", name, "'");
    return it->second;
  };
  try {
    config_ = model_config_from_hf_json(parse_json_file(bytes_of(kConfigFile), dir / kConfigFile));
  } catch (const Error& e) {
    throw_error("'", (dir / kConfigFile).string(), "': ", e.what());
  }
  trainer_state_ = parse_json_file(bytes_of(kTrainerStateFile), dir / kTrainerStateFile);
  if (!trainer_state_.is_object())
    throw_error("'", (dir / kTrainerStateFile).string(), "' is not a JSON object");
  auto parse = [&](const std::string& name) -> const SafetensorsFile& {
    const std::vector<uint8_t>& bytes = bytes_of(name);
    files_.push_back(std::make_unique<SafetensorsFile>(parse_safetensors(bytes.data(), bytes.size(), (dir / name).string())));
    return *files_.back();
  };

  if (!sharded_) {
    for (const SafetensorsEntry& e : parse(kModelFile).entries)
      tensors_[e.name] = {e.shape, {{&e, 0, shape_numel(e.shape), 0}}, true};
    for (const SafetensorsEntry& e : parse(kOptimizerFile).entries)
      tensors_[e.name] = {e.shape, {{&e, 0, shape_numel(e.shape), 0}}, false};
    return;
  }
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& [name, record] : manifest["files"].items())
    if (name.rfind("shard-", 0) == 0 && !ranged_entries_.count(name)) by_file[name] = &parse(name);
  const auto lookup = [&](const std::string& file,
                          const std::string& tensor) -> std::optional<EntryRef> {
    if (const auto in_memory = by_file.find(file); in_memory != by_file.end())
      return EntryRef{&in_memory->second->at(tensor), nullptr};
    const auto shard = ranged_entries_.find(file);
    if (shard == ranged_entries_.end()) return std::nullopt;
    const auto entry = shard->second.find(tensor);
    if (entry == shard->second.end())
      throw_error("safetensors '", (dir / file).string(), "' has no tensor '", tensor, "'");
    return EntryRef{nullptr, &entry->second};
  };
  load_index(dir, parse_json_file(bytes_of(kIndexFile), dir / kIndexFile), lookup);
}

const uint8_t* CheckpointReader::entry_bytes(const Piece& piece) const {
  if (piece.entry) return piece.entry->bytes.data();
  const RangedEntry& ranged = *piece.ranged;
  if (!ranged.loaded) {
    ranged.bytes = ranged.file->read(ranged.layout.begin, ranged.layout.end - ranged.layout.begin);
    verify_safetensors_crc(ranged.layout, ranged.bytes.data(), ranged.file->path());
    tensor_bytes_read_ += ranged.bytes.size();
    ranged.loaded = true;
  }
  return ranged.bytes.data();
}

void CheckpointReader::load_index(const fs::path& dir, const json& index,
                                  const EntryLookup& lookup) {
  const std::string index_path = (dir / kIndexFile).string();
  if (!index.is_object() || !index.contains("format") || !index["format"].is_string() ||
      index["format"].get<std::string>() != kIndexFormat)
    throw_error("'", index_path, "' is not a loom sharded index (expected \"format\": \"", kIndexFormat, "\")");
  if (!index.contains("world_size") || !index["world_size"].is_number_integer() || index["world_size"].get<int64_t>() < 1 ||
      index["world_size"].get<int64_t>() > std::numeric_limits<int>::max())
    throw_error("'", index_path, "': \"world_size\" is missing or not a positive integer");
  world_ = index["world_size"].get<int>();
  if (!index.contains("tensors") || !index["tensors"].is_object())
    throw_error("'", index_path, "': \"tensors\" is missing or not an object");
  auto bad = [&](const std::string& tensor, const std::string& what) {
    throw_error("'", index_path, "': tensor '", tensor, "': ", what);
  };
  for (const auto& item : index["tensors"].items()) {
    const std::string name = item.key();  // a copy the lambdas below can capture
    const json& t = item.value();
    if (!t.is_object() || !t.contains("shape") || !t["shape"].is_array() || !t.contains("pieces") ||
        !t["pieces"].is_array())
      bad(name, "expected an object with \"shape\" and \"pieces\" arrays");
    Stored stored{{}, {}, false};
    int64_t numel = 1;
    for (const json& extent : t["shape"]) {
      // Extents up to 2^40 keep every product of a few of them inside int64_t.
      if (!extent.is_number_integer() || extent.get<int64_t>() < 0 || extent.get<int64_t>() > (int64_t{1} << 40))
        bad(name, "a shape extent is not an integer in [0, 2^40]: " + extent.dump());
      stored.shape.push_back(extent.get<int64_t>());
      if (__builtin_mul_overflow(numel, stored.shape.back(), &numel) || numel > (int64_t{1} << 40))
        bad(name, "shape " + t["shape"].dump() + " holds more than 2^40 elements");
    }
    for (const json& p : t["pieces"]) {
      auto field = [&](const char* key, bool required) -> int64_t {
        if (!p.is_object() || (required && !p.contains(key))) bad(name, std::string("a piece lacks \"") + key + "\"");
        if (!p.contains(key)) return 0;
        if (!p[key].is_number_integer() || p[key].get<int64_t>() < 0 || p[key].get<int64_t>() > numel)
          bad(name, std::string("a piece's \"") + key + "\" is not an integer in [0, " + std::to_string(numel) + "]");
        return p[key].get<int64_t>();
      };
      const int64_t start = field("start", true), count = field("count", true), offset = field("offset", false);
      if (!p.contains("file") || !p["file"].is_string()) bad(name, "a piece lacks \"file\"");
      const std::string file = p["file"].get<std::string>();
      if (start + count > numel)
        bad(name, "a piece covers elements [" + std::to_string(start) + ", " + std::to_string(start + count) +
                      "), outside its " + std::to_string(numel));
      const std::optional<EntryRef> ref = lookup(file, name);
      if (!ref) throw_error("'", index_path, "' names '", file, "', which the manifest lacks");
      const std::string& dtype = ref->entry ? ref->entry->dtype : ref->ranged->layout.dtype;
      const uint64_t entry_bytes = ref->entry ? ref->entry->bytes.size()
                                              : ref->ranged->layout.end - ref->ranged->layout.begin;
      if (dtype != "F32" || entry_bytes < static_cast<uint64_t>(offset + count) * sizeof(float))
        throw_error("'", (dir / file).string(), "': tensor '", name, "' does not hold F32 elements [", offset, ", ",
                    offset + count, ") as the index says");
      stored.pieces.push_back({ref->entry, start, count, offset, ref->ranged});
    }
    // read() walks the pieces in order of their first element and needs them to cover the
    // tensor exactly once.
    std::sort(stored.pieces.begin(), stored.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.start < b.start; });
    int64_t covered = 0;
    for (const Piece& piece : stored.pieces) {
      if (piece.start != covered)
        bad(name, "its pieces " + std::string(piece.start < covered ? "overlap" : "leave a gap") + " at element " +
                      std::to_string(std::min(piece.start, covered)));
      covered += piece.count;
    }
    if (covered != numel)
      bad(name, "its pieces cover " + std::to_string(covered) + " of its " + std::to_string(numel) + " elements");
    tensors_[name] = std::move(stored);
  }
}

bool CheckpointReader::has(const std::string& tensor) const { return tensors_.count(tensor) > 0; }

const Shape& CheckpointReader::stored_shape(const std::string& tensor) const {
  const auto it = tensors_.find(tensor);
  if (it == tensors_.end()) throw_error("checkpoint '", dir_, "' has no tensor '", tensor, "'");
  return it->second.shape;
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, stored] : tensors_) names.push_back(name);
  return names;
}

const std::vector<float>& CheckpointReader::converted(const std::string& name, const Stored& stored,
                                                      bool transposed) const {
  auto it = converted_.find(name);
  if (it == converted_.end())
    it = converted_.emplace(name, hf_entry_to_loom_values(*stored.pieces.front().entry, transposed)).first;
  return it->second;
}

void CheckpointReader::read(const TensorLayout& layout, int64_t start, int64_t count, float* out) const {
  const auto it = tensors_.find(layout.name);
  if (it == tensors_.end()) throw_error("checkpoint '", dir_, "' has no tensor '", layout.name, "'");
  const Stored& stored = it->second;
  Shape expected = layout.shape;
  if (stored.model_weight && layout.hf_transposed) std::reverse(expected.begin(), expected.end());
  if (stored.shape != expected)
    throw_error("checkpoint '", dir_, "': tensor '", layout.name, "' has shape ", shape_to_string(stored.shape),
                ", expected ", shape_to_string(expected));
  if (start < 0 || count < 0 || start + count > shape_numel(layout.shape))
    throw_error("checkpoint '", dir_, "': elements [", start, ", ", start + count, ") are outside tensor '",
                layout.name, "' of ", shape_numel(layout.shape));
  if (stored.model_weight) {
    const std::vector<float>& values = converted(layout.name, stored, layout.hf_transposed);
    std::copy(values.begin() + start, values.begin() + start + count, out);
    return;
  }
  // Pieces are sorted by start and cover the tensor once (finish_sharded_checkpoint checked):
  // begin at the last piece that starts at or before `start`.
  auto first = std::upper_bound(stored.pieces.begin(), stored.pieces.end(), start,
                                [](int64_t value, const Piece& piece) { return value < piece.start; });
  if (first != stored.pieces.begin()) --first;
  for (auto piece = first; piece != stored.pieces.end() && piece->start < start + count; ++piece) {
    const int64_t lo = std::max(start, piece->start), hi = std::min(start + count, piece->start + piece->count);
    if (lo >= hi) continue;
    const std::string& dtype = piece->entry ? piece->entry->dtype : piece->ranged->layout.dtype;
    if (dtype != "F32")
      throw_error("checkpoint '", dir_, "': tensor '", layout.name, "' is ", dtype,
                  ", expected F32");
    std::memcpy(out + (lo - start),
                entry_bytes(*piece) + (piece->offset + lo - piece->start) * sizeof(float),
                static_cast<size_t>(hi - lo) * sizeof(float));
  }
}

}  // namespace loom
