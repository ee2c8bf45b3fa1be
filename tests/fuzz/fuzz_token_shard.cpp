// libFuzzer target: an llm.c token shard of either width (header, size, token ids) as parse_token_shard, which
// shares its checks with read_token_shard and token_shard_size, sees it. Malformed input must
// end in a loom::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/data/token_shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    // GPT-2's vocabulary for uint16 shards, Llama 3's for uint32 ones (both formats are read).
    const loom::ShardTokens tokens = loom::parse_token_shard(data, size, 128256, "fuzz.bin");
    if (!tokens.empty() && tokens[tokens.size() - 1] >= 128256) __builtin_trap();
  } catch (const loom::Error&) {
  }
  return 0;
}
