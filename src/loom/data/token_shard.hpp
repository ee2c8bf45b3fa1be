#pragma once
// llm.c's token shard format (dev/data/data_common.py, write_datafile), so shards made by
// llm.c's scripts and by loom are interchangeable:
//   header: 256 little-endian int32; [0] = 20240520 (magic), [1] = 1 (version: uint16 tokens),
//           [2] = number of tokens; the rest are zero.
//   body:   that many little-endian uint16 token ids.
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderInts = 256;
inline constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;

// Writes `path` atomically (via `path.tmp`, fsync, rename). Every token must fit a uint16.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens);

// Reads and validates a whole shard: header, file size, and every token < vocab_size.
std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size);

// The same from a whole shard held in memory; `source` names it in errors. What the file
// readers check, from the bytes (tests/fuzz/ feeds it malformed shards).
std::vector<uint16_t> parse_token_shard(const uint8_t* data, size_t size, int64_t vocab_size, const std::string& source);

// Token count from the header alone (also checks magic, version and file size); cheap enough
// to call on every shard of a large dataset.
int64_t token_shard_size(const std::string& path);

// The longest document of a shard, as packed-document attention sees documents: the tokens
// after one `eot_token` up to and including the next (the end token closes its document; the
// first document starts at the shard's first token, the last may have no end token). Reads the
// shard in pieces, so it costs one pass over the file and little memory.
struct LongestDocument {
  int64_t tokens = 0;  // its length, end token included
  int64_t offset = 0;  // its first token's position in the shard
};
LongestDocument longest_document(const std::string& path, int32_t eot_token);

}  // namespace loom
