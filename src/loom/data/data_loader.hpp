#pragma once
// Training sequences from llm.c token shards (uint16 or uint32 tokens), from one or several
// sources mixed by weight.
//
// A shard of n tokens holds (n - 1) / T sequence slots: slot k is tokens [kT, kT + T) as input
// and [kT + 1, kT + T] as target (the last token of a slot is the first of the next, used only
// as a target), so sequences never cross a shard and documents keep their boundaries. A
// source's slots are numbered across its shards in name order; its j-th sequence is slot
// perm_e(j mod N) of epoch e = j / N, where N is the source's slot count and perm_e is the
// identity, or with shuffling a keyed pseudo-random permutation of all N slots (a Feistel
// bijection: shuffles across shards in O(1) memory, however many there are). Without
// shuffling one source reads its shards front to back as llm.c's loader does.
//
// Mixing: the g-th sequence overall comes from the source s that maximises
// w_s (g + 1) - c_s (c_s: sequences taken from s so far; lowest index on ties), so after any g
// sequences every source has had its share w_s g to within two sequences (about one in
// practice).
//
// The position is kept in sequences, not batches (LoaderState): a run resumed with another
// batch split (another dp size, micro-batch size or accumulation, at the same global batch)
// reads exactly the sequences the uninterrupted run would have. Shards are memory-mapped, and
// at most kMaxMappedShards stay mapped.
#include <cstdint>
#include <list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/token_shard.hpp"

namespace loom {

// One source of training data as configured: a glob of shards and its share of the sequences.
struct DataSource {
  std::string pattern;
  double weight = 1.0;
};

// Where the next sequence will be read from; saved in checkpoints for an exact resume.
struct LoaderState {
  int64_t sequences = 0;                   // sequences read so far, over all sources
  std::vector<int64_t> source_sequences;   // of them, from each source (sums to `sequences`)

  bool operator==(const LoaderState&) const = default;
};

// The position as checkpoints and metrics hold it: {"sequences", "source_sequences"}. Reading
// refuses, naming `checkpoint`, a malformed one and the (epoch, shard, position) of checkpoints
// written before positions were counted in sequences.
nlohmann::json loader_state_json(const LoaderState& state);
LoaderState loader_state_from_json(const nlohmann::json& loader, const std::string& checkpoint);

// The files matching a glob pattern, sorted by name (byte order, whatever the locale).
std::vector<std::string> expand_shard_pattern(const std::string& glob_pattern);

// A keyed pseudo-random bijection of [0, size): 4 Feistel rounds on the smallest even number of
// bits covering `size`, walking the cycle until the value falls inside.
int64_t permute_index(int64_t index, int64_t size, uint64_t key);

// Evaluation reads held-out sequences in this fixed shuffled order, so a sample of batches
// covers the whole held-out set and every evaluation (trainer or `loom eval`) sees the same.
inline constexpr uint64_t kEvalShuffleSeed = 0xe7a1;

// Packed documents: refuses, naming the shard, offset and length, the first document in
// `shard_paths` longer than seq_len, which no row could hold whole (it would be cut at row
// boundaries). One pass over every shard; `key` names the config key of the shards.
void check_documents_fit(const std::vector<std::string>& shard_paths, int32_t eot_token, int64_t seq_len,
                         const std::string& key);

class DataLoader {
 public:
  static constexpr size_t kMaxMappedShards = 16;

  // `names` label the sources in errors (e.g. "data.sources[1] 'web/*.bin'").
  DataLoader(std::vector<std::vector<std::string>> source_shards, std::vector<double> weights,
             std::vector<std::string> names, int64_t batch_size, int64_t seq_len, int64_t vocab_size);
  // One source: these shards, in this order.
  DataLoader(std::vector<std::string> shard_paths, int64_t batch_size, int64_t seq_len, int64_t vocab_size);
  static DataLoader from_pattern(const std::string& glob_pattern, int64_t batch_size, int64_t seq_len,
                                 int64_t vocab_size);
  // `key` is the config key the sources came from, for errors.
  static DataLoader from_sources(const std::vector<DataSource>& sources, const std::string& key,
                                 int64_t batch_size, int64_t seq_len, int64_t vocab_size);

  // Fills batch_size*seq_len entries of each array, row-major [batch_size, seq_len]: the next
  // batch_size sequences.
  void next_batch(int32_t* inputs, int32_t* targets);
  // The next sequence alone (seq_len entries each); `source` gets its source's index if given.
  void next_sequence(int32_t* inputs, int32_t* targets, int64_t* source = nullptr);

  // Shuffle every source's slots across all its shards, a fresh permutation per (seed, source,
  // epoch). Without it, a corpus stored in document order (e.g. by year) trains era by era.
  void set_shuffle(uint64_t seed);

  LoaderState state() const { return state_; }
  // Continues from a state() taken earlier with the same sources (any batch size).
  void restore(const LoaderState& state);

  int64_t source_count() const { return static_cast<int64_t>(sources_.size()); }
  // Sequence slots in one pass over source `s`.
  int64_t source_slots(int64_t s) const { return sources_[static_cast<size_t>(s)].slots; }
  double source_weight(int64_t s) const { return sources_[static_cast<size_t>(s)].weight; }
  // Every shard of every source, in source order.
  std::vector<std::string> shard_paths() const;
  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t tokens_per_batch() const { return batch_size_ * seq_len_; }
  // Shards mapped now (at most kMaxMappedShards).
  size_t mapped_shards() const { return mapped_.size(); }

 private:
  struct Source {
    std::string name;
    std::vector<std::string> shards;
    std::vector<int64_t> shard_tokens;  // from the headers, to catch shards changed mid-run
    std::vector<int64_t> first_slot;    // prefix sums of the shards' slot counts
    int64_t slots = 0;
    double weight = 1.0;  // normalised: the weights sum to 1
  };
  int64_t pick_source() const;
  const MappedShard& shard(int64_t source, int64_t index);

  std::vector<Source> sources_;
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t vocab_size_;
  LoaderState state_;
  bool shuffle_ = false;
  uint64_t shuffle_seed_ = 0;
  struct Mapped {
    int64_t source, index;
    MappedShard map;
  };
  std::list<Mapped> mapped_;  // most recently used first
};

}  // namespace loom
