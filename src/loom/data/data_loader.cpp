#include "loom/data/data_loader.hpp"

#include <glob.h>

#include <algorithm>

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

DataLoader::DataLoader(std::vector<std::string> shard_paths, int64_t batch_size, int64_t seq_len,
                       int64_t vocab_size)
    : shard_paths_(std::move(shard_paths)),
      batch_size_(batch_size),
      seq_len_(seq_len),
      vocab_size_(vocab_size) {
  if (shard_paths_.empty()) throw_error("DataLoader: no token shards given");
  if (batch_size <= 0 || seq_len <= 0) {
    throw_error("DataLoader: batch size and sequence length must be positive, got B=", batch_size,
                " T=", seq_len);
  }
  if (vocab_size <= 0) throw_error("DataLoader: vocab_size must be positive, got ", vocab_size);
  // Headers only: fail now, not hours into training, if any shard cannot hold one batch.
  for (const std::string& path : shard_paths_) {
    const int64_t count = token_shard_size(path);
    if (count < window_tokens()) {
      throw_error("token shard '", path, "' holds ", count,
                  " tokens, fewer than one batch needs (B*T+1 = ", batch_size, "*", seq_len,
                  "+1 = ", window_tokens(), ")");
    }
    shard_token_counts_.push_back(count);
  }
  load_shard(0);
}

DataLoader DataLoader::from_pattern(const std::string& glob_pattern, int64_t batch_size, int64_t seq_len,
                                    int64_t vocab_size) {
  return DataLoader(expand_shard_pattern(glob_pattern), batch_size, seq_len, vocab_size);
}

void DataLoader::load_shard(int64_t shard_index) {
  if (shard_index == loaded_shard_index_) return;
  const std::string& path = shard_paths_[shard_index];
  // Free the old shard before reading the new one, so that at most one is ever resident.
  loaded_tokens_ = ShardTokens();
  loaded_shard_index_ = -1;
  loaded_tokens_ = read_token_shard(path, vocab_size_);
  if (loaded_tokens_.size() != shard_token_counts_[shard_index]) {
    throw_error("token shard '", path, "' now holds ", loaded_tokens_.size(), " tokens but held ",
                shard_token_counts_[shard_index],
                " when training started; shards must not change during a run");
  }
  loaded_shard_index_ = shard_index;
}

void DataLoader::set_shuffle(uint64_t seed) {
  shuffle_ = true;
  shuffle_seed_ = seed;
  slot_order_epoch_ = slot_order_shard_ = -1;
}

void DataLoader::ensure_slot_order() {
  if (slot_order_epoch_ == state_.epoch && slot_order_shard_ == state_.shard_index) return;
  // Slot k covers tokens [k T, k T + T]; the last token of a slot is the first of the next,
  // used only as a target.
  const int64_t slots = (loaded_tokens_.size() - 1) / seq_len_;
  slot_order_.resize(static_cast<size_t>(slots));
  for (int64_t k = 0; k < slots; ++k) slot_order_[static_cast<size_t>(k)] = k;
  const CounterRng rng(shuffle_seed_ + static_cast<uint64_t>(state_.epoch), static_cast<uint64_t>(state_.shard_index));
  for (int64_t k = slots - 1; k > 0; --k)  // Fisher-Yates
    std::swap(slot_order_[static_cast<size_t>(k)],
              slot_order_[rng.bits(static_cast<uint64_t>(k)) % static_cast<uint64_t>(k + 1)]);
  slot_order_epoch_ = state_.epoch;
  slot_order_shard_ = state_.shard_index;
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  load_shard(state_.shard_index);
  if (shuffle_) {
    ensure_slot_order();
    const int64_t first_slot = state_.position / seq_len_;  // position is a multiple of B*T
    for (int64_t b = 0; b < batch_size_; ++b) {
      const int64_t seq = slot_order_[static_cast<size_t>(first_slot + b)] * seq_len_;
      loaded_tokens_.copy_to(seq, seq_len_, inputs + b * seq_len_);
      loaded_tokens_.copy_to(seq + 1, seq_len_, targets + b * seq_len_);
    }
  } else {
    loaded_tokens_.copy_to(state_.position, tokens_per_batch(), inputs);
    loaded_tokens_.copy_to(state_.position + 1, tokens_per_batch(), targets);
  }
  // Advance now so that state() always names a window that fits.
  state_.position += tokens_per_batch();
  if (state_.position + window_tokens() > loaded_tokens_.size()) {
    state_.position = 0;
    if (++state_.shard_index == static_cast<int64_t>(shard_paths_.size())) {
      state_.shard_index = 0;
      ++state_.epoch;
    }
  }
}

void DataLoader::restore(const LoaderState& state) {
  const auto shard_count = static_cast<int64_t>(shard_paths_.size());
  if (state.epoch < 0) throw_error("DataLoader::restore: epoch ", state.epoch, " is negative");
  if (state.shard_index < 0 || state.shard_index >= shard_count) {
    throw_error("DataLoader::restore: shard index ", state.shard_index, " is outside [0, ", shard_count,
                ") for the ", shard_count, " shards given; was the state saved with a different shard list?");
  }
  const int64_t shard_tokens = shard_token_counts_[state.shard_index];
  if (state.position < 0 || state.position + window_tokens() > shard_tokens) {
    throw_error("DataLoader::restore: position ", state.position, " in shard '",
                shard_paths_[state.shard_index], "' (", shard_tokens,
                " tokens) leaves no room for a window of B*T+1 = ", window_tokens(), " tokens");
  }
  if (state.position % tokens_per_batch() != 0) {
    throw_error("DataLoader::restore: position ", state.position,
                " is not a multiple of B*T = ", tokens_per_batch(),
                "; was the state saved with a different batch size or sequence length?");
  }
  load_shard(state.shard_index);
  state_ = state;
}

}  // namespace loom
