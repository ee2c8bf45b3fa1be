#pragma once
// Shared by the one-process and multi-rank bad-step tests: token shards that each hold exactly
// one loader batch, so a run "whose data omitted some batches" is the same files minus those.
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "loom/data/token_shard.hpp"
#include "model_fixtures.hpp"

namespace loom::test {

// `count` shards of `batch_tokens` + 1 tokens (a loader batch of B x T tokens reads B x T + 1
// and then moves to the next shard), named by their index in the full sequence so that the
// files left after omitting some still sort in the same order. Batch i's tokens depend on i only.
inline void write_batch_shards(const std::string& dir, int64_t count, int64_t batch_tokens,
                               int64_t vocab, const std::set<int64_t>& omit = {}) {
  std::filesystem::create_directories(dir);
  for (int64_t i = 0; i < count; ++i) {
    if (omit.count(i)) continue;
    char name[32];
    std::snprintf(name, sizeof name, "/batch_%06lld.bin", static_cast<long long>(i));
    write_token_shard(dir + name,
                      random_tokens(batch_tokens + 1, vocab, 1000 + static_cast<uint64_t>(i)));
  }
}

// Loader batches [first, first + count).
inline std::set<int64_t> batch_range(int64_t first, int64_t count) {
  std::set<int64_t> out;
  for (int64_t i = first; i < first + count; ++i) out.insert(i);
  return out;
}

}  // namespace loom::test
