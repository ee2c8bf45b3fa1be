#pragma once
// Streams (input, target) batches from llm.c token shards (uint16 or uint32 tokens), as llm.c's dataloader.h does:
// each batch is a contiguous window of B*T+1 tokens, targets are inputs shifted by one, and
// the next window starts B*T tokens later. Tokens left at the end of a shard that cannot fill
// a window are skipped; after the last shard a new epoch starts at the first. No shuffling,
// so a run is reproducible from (epoch, shard, position) alone. One shard is in memory.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/token_shard.hpp"

namespace loom {

// Where the next batch will be read from; saved in checkpoints for an exact resume.
struct LoaderState {
  int64_t epoch = 0;        // passes over all shards completed
  int64_t shard_index = 0;  // index into DataLoader::shard_paths()
  int64_t position = 0;     // token offset of the next window in that shard

  bool operator==(const LoaderState&) const = default;
};

// The files matching a glob pattern, sorted by name (byte order, whatever the locale).
std::vector<std::string> expand_shard_pattern(const std::string& glob_pattern);

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
  DataLoader(std::vector<std::string> shard_paths, int64_t batch_size, int64_t seq_len, int64_t vocab_size);
  static DataLoader from_pattern(const std::string& glob_pattern, int64_t batch_size, int64_t seq_len,
                                 int64_t vocab_size);

  // Fills batch_size*seq_len entries of each array, row-major [batch_size, seq_len].
  void next_batch(int32_t* inputs, int32_t* targets);

  // Shuffle: each batch takes B sequences of T (+1) tokens from slots of the current shard in
  // a random order, a fresh permutation per (seed, epoch, shard), instead of one contiguous
  // window. The state keeps its meaning (tokens consumed in this shard), so resume is exact.
  // Without it, a corpus stored in document order (e.g. by year) trains era by era.
  void set_shuffle(uint64_t seed);

  LoaderState state() const { return state_; }
  // Continues from a state() taken earlier with the same shards and batch shape.
  void restore(const LoaderState& state);

  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t tokens_per_batch() const { return batch_size_ * seq_len_; }

 private:
  int64_t window_tokens() const { return tokens_per_batch() + 1; }
  void load_shard(int64_t shard_index);

  std::vector<std::string> shard_paths_;
  std::vector<int64_t> shard_token_counts_;  // from the headers, to validate restore()
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t vocab_size_;
  LoaderState state_;
  int64_t loaded_shard_index_ = -1;
  ShardTokens loaded_tokens_;  // as stored: uint16 shards stay 2 bytes a token
  void ensure_slot_order();
  bool shuffle_ = false;
  uint64_t shuffle_seed_ = 0;
  std::vector<int64_t> slot_order_;  // permutation of the loaded shard's sequence slots
  int64_t slot_order_epoch_ = -1, slot_order_shard_ = -1;
};

}  // namespace loom
