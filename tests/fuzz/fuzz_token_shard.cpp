// libFuzzer target: an llm.c token shard (header, size, token ids) as parse_token_shard, which
// shares its checks with read_token_shard and token_shard_size, sees it. Malformed input must
// end in a loom::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/data/token_shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)loom::parse_token_shard(data, size, 50257, "fuzz.bin");
  } catch (const loom::Error&) {
  }
  return 0;
}
