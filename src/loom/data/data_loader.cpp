#include "loom/data/data_loader.hpp"

#include <glob.h>

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/data/token_shard.hpp"

namespace loom {

std::vector<std::string> expand_shard_pattern(const std::string& glob_pattern) {
  glob_t matches{};
  const int rc = ::glob(glob_pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH) throw_error("no token shards match the pattern '", glob_pattern, "'");
  if (rc != 0) {
    throw_error("cannot expand the shard pattern '", glob_pattern,
                "': ", rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory");
  }
  // glob() sorts with the locale's collation; byte order keeps shard order the same everywhere.
  std::sort(paths.begin(), paths.end());
  return paths;
}

void check_documents_fit(const std::vector<std::string>& shard_paths, int32_t eot_token, int64_t seq_len,
                         const std::string& key) {
  for (const std::string& path : shard_paths) {
    const LongestDocument longest = longest_document(path, eot_token);
    if (longest.tokens <= seq_len) continue;
    throw_error(key, ": shard '", path, "' has a document of ", longest.tokens, " tokens (from token ",
                longest.offset, ", end token ", eot_token, " included), longer than data.seq_len = ", seq_len,
                ": no sequence holds it whole, so with data.document_mask it would be cut at row "
                "boundaries and never computed as it is alone. Raise data.seq_len to at least ",
                longest.tokens, ", or set data.split_long_documents = true to train on its pieces "
                "(Llama 3's packing), or check data.eot_token (",
                eot_token, ") is the end-of-document token these shards were made with");
  }
}

nlohmann::json loader_state_json(const LoaderState& state) {
  return {{"sequences", state.sequences}, {"source_sequences", state.source_sequences}};
}

LoaderState loader_state_from_json(const nlohmann::json& loader, const std::string& checkpoint) {
  if (!loader.is_object() || !loader.contains("sequences") || !loader.contains("source_sequences")) {
    throw_error("checkpoint '", checkpoint, "': its data position ", loader.dump(),
                " is not in sequences read ({\"sequences\", \"source_sequences\"}); checkpoints written before "
                "loom counted the data position in sequences (epoch, shard, position) cannot say where to go on");
  }
  try {
    return {loader.at("sequences").get<int64_t>(), loader.at("source_sequences").get<std::vector<int64_t>>()};
  } catch (const nlohmann::json::exception& e) {
    throw_error("checkpoint '", checkpoint, "': data position ", loader.dump(), " is malformed: ", e.what());
  }
}

int64_t permute_index(int64_t index, int64_t size, uint64_t key) {
  LOOM_CHECK(size > 0 && index >= 0 && index < size, "permute_index(", index, ", ", size, ")");
  if (size == 1) return 0;
  int bits = 2;
  while ((int64_t{1} << bits) < size) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  auto x = static_cast<uint64_t>(index);
  do {  // cycle-walk: a value outside [0, size) is permuted again until it lands inside
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t next = left ^ (CounterRng(key, round).bits(right) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(size));
  return static_cast<int64_t>(x);
}

DataLoader::DataLoader(std::vector<std::vector<std::string>> source_shards, std::vector<double> weights,
                       std::vector<std::string> names, int64_t batch_size, int64_t seq_len, int64_t vocab_size)
    : batch_size_(batch_size), seq_len_(seq_len), vocab_size_(vocab_size) {
  if (source_shards.empty()) throw_error("DataLoader: no data sources given");
  if (weights.size() != source_shards.size() || names.size() != source_shards.size())
    throw_error("DataLoader: ", source_shards.size(), " sources but ", weights.size(), " weights and ", names.size(),
                " names");
  if (batch_size <= 0 || seq_len <= 0) {
    throw_error("DataLoader: batch size and sequence length must be positive, got B=", batch_size,
                " T=", seq_len);
  }
  if (vocab_size <= 0) throw_error("DataLoader: vocab_size must be positive, got ", vocab_size);
  double total_weight = 0;
  for (size_t s = 0; s < source_shards.size(); ++s) {
    if (!(weights[s] > 0) || !std::isfinite(weights[s]))
      throw_error(names[s], ": weight ", weights[s], " must be a positive finite number");
    total_weight += weights[s];
  }
  for (size_t s = 0; s < source_shards.size(); ++s) {
    Source source;
    source.name = names[s];
    source.shards = std::move(source_shards[s]);
    source.weight = weights[s] / total_weight;
    if (source.shards.empty()) throw_error(source.name, ": no token shards");
    // Headers only: fail now, not hours into training.
    for (const std::string& path : source.shards) {
      const int64_t count = token_shard_size(path);
      source.shard_tokens.push_back(count);
      source.first_slot.push_back(source.slots);
      source.slots += count > 0 ? (count - 1) / seq_len : 0;
    }
    if (source.slots == 0) {
      throw_error(source.name, ": its ", source.shards.size(), " shard(s) hold no sequence of T+1 = ", seq_len + 1,
                  " tokens (the first, '", source.shards.front(), "', holds ", source.shard_tokens.front(), ")");
    }
    sources_.push_back(std::move(source));
  }
  state_.source_sequences.assign(sources_.size(), 0);
}

DataLoader::DataLoader(std::vector<std::string> shard_paths, int64_t batch_size, int64_t seq_len,
                       int64_t vocab_size)
    : DataLoader({std::move(shard_paths)}, {1.0}, {"token shards"}, batch_size, seq_len, vocab_size) {}

DataLoader DataLoader::from_pattern(const std::string& glob_pattern, int64_t batch_size, int64_t seq_len,
                                    int64_t vocab_size) {
  return DataLoader({expand_shard_pattern(glob_pattern)}, {1.0}, {"token shards '" + glob_pattern + "'"}, batch_size,
                    seq_len, vocab_size);
}

DataLoader DataLoader::from_sources(const std::vector<DataSource>& sources, const std::string& key,
                                    int64_t batch_size, int64_t seq_len, int64_t vocab_size) {
  std::vector<std::vector<std::string>> shards;
  std::vector<double> weights;
  std::vector<std::string> names;
  for (size_t s = 0; s < sources.size(); ++s) {
    names.push_back(key + "[" + std::to_string(s) + "] '" + sources[s].pattern + "'");
    try {
      shards.push_back(expand_shard_pattern(sources[s].pattern));
    } catch (const Error& e) {
      throw_error(names.back(), ": ", e.what());
    }
    weights.push_back(sources[s].weight);
  }
  return DataLoader(std::move(shards), std::move(weights), std::move(names), batch_size, seq_len, vocab_size);
}

std::vector<std::string> DataLoader::shard_paths() const {
  std::vector<std::string> paths;
  for (const Source& source : sources_) paths.insert(paths.end(), source.shards.begin(), source.shards.end());
  return paths;
}

void DataLoader::set_shuffle(uint64_t seed) {
  shuffle_ = true;
  shuffle_seed_ = seed;
}

int64_t DataLoader::pick_source() const {
  const auto next = static_cast<double>(state_.sequences + 1);
  int64_t best = 0;
  double best_deficit = 0;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const double deficit = sources_[s].weight * next - static_cast<double>(state_.source_sequences[s]);
    if (s == 0 || deficit > best_deficit) {
      best = static_cast<int64_t>(s);
      best_deficit = deficit;
    }
  }
  return best;
}

const MappedShard& DataLoader::shard(int64_t source, int64_t index) {
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if (it->source == source && it->index == index) {
      mapped_.splice(mapped_.begin(), mapped_, it);
      return mapped_.front().map;
    }
  }
  const Source& src = sources_[static_cast<size_t>(source)];
  const std::string& path = src.shards[static_cast<size_t>(index)];
  if (mapped_.size() >= kMaxMappedShards) mapped_.pop_back();
  MappedShard map(path, vocab_size_);
  if (map.size() != src.shard_tokens[static_cast<size_t>(index)]) {
    throw_error("token shard '", path, "' now holds ", map.size(), " tokens but held ",
                src.shard_tokens[static_cast<size_t>(index)],
                " when training started; shards must not change during a run");
  }
  mapped_.push_front({source, index, std::move(map)});
  return mapped_.front().map;
}

void DataLoader::next_sequence(int32_t* inputs, int32_t* targets, int64_t* source_out) {
  const int64_t s = pick_source();
  const Source& source = sources_[static_cast<size_t>(s)];
  const int64_t taken = state_.source_sequences[static_cast<size_t>(s)];
  const int64_t epoch = taken / source.slots;
  int64_t slot = taken % source.slots;
  if (shuffle_) {
    const uint64_t key = CounterRng(shuffle_seed_ + static_cast<uint64_t>(s), static_cast<uint64_t>(epoch)).bits(0);
    slot = permute_index(slot, source.slots, key);
  }
  // The shard holding the slot: the last one whose first slot is <= it.
  const auto after = std::upper_bound(source.first_slot.begin(), source.first_slot.end(), slot);
  const auto index = static_cast<int64_t>(after - source.first_slot.begin()) - 1;
  const int64_t begin = (slot - source.first_slot[static_cast<size_t>(index)]) * seq_len_;
  const MappedShard& map = shard(s, index);
  map.copy_to(begin, seq_len_, inputs);
  map.copy_to(begin + 1, seq_len_, targets);
  ++state_.sequences;
  ++state_.source_sequences[static_cast<size_t>(s)];
  if (source_out != nullptr) *source_out = s;
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  for (int64_t b = 0; b < batch_size_; ++b) next_sequence(inputs + b * seq_len_, targets + b * seq_len_);
}

void DataLoader::restore(const LoaderState& state) {
  if (state.source_sequences.size() != sources_.size()) {
    throw_error("DataLoader::restore: the saved position counts sequences from ", state.source_sequences.size(),
                " data source(s) but the run reads ", sources_.size(),
                "; resume with the sources the run was started with (their weights may change)");
  }
  int64_t sum = 0;
  for (size_t s = 0; s < sources_.size(); ++s) {
    if (state.source_sequences[s] < 0)
      throw_error("DataLoader::restore: ", sources_[s].name, ": ", state.source_sequences[s],
                  " sequences read is negative");
    sum += state.source_sequences[s];
  }
  if (state.sequences != sum) {
    throw_error("DataLoader::restore: ", state.sequences, " sequences read in all, but the sources' counts sum to ",
                sum);
  }
  state_ = state;
}

}  // namespace loom
