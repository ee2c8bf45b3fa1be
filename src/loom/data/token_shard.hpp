#pragma once
// llm.c's token shard formats (dev/data/data_common.py, write_datafile), so shards made by
// llm.c's scripts and by loom are interchangeable:
//   header: 256 little-endian int32; [0] = magic, [1] = version, [2] = number of tokens; the
//           rest are zero.
//   GPT-2 shards:   magic 20240520, version 1, then that many little-endian uint16 token ids.
//   Llama 3 shards: magic 20240801, version 7, then little-endian uint32 token ids (for
//                   vocabularies above 65,536 tokens: Llama 3 has 128,256).
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

inline constexpr int32_t kTokenShardMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int32_t kWideTokenShardMagic = 20240801;  // uint32 tokens
inline constexpr int32_t kWideTokenShardVersion = 7;
inline constexpr int64_t kTokenShardHeaderInts = 256;
inline constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;
inline constexpr int64_t kMaxNarrowShardVocab = 65536;        // ids that fit a uint16
inline constexpr int64_t kMaxWideShardVocab = int64_t{1} << 32;  // ids that fit a uint32

// Writes `path` atomically (via `path.tmp`, fsync, rename). With vocab_size > 0 the format
// follows the vocabulary: uint16 when vocab_size <= 65,536, else uint32, and every token must be
// below vocab_size; with vocab_size = 0, uint16 unless a token needs more. Nothing is written
// when a token or the vocabulary does not fit.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size = 0);

// A shard's tokens as stored: 2 bytes each for uint16 shards (no widening in memory), 4 for
// uint32 ones.
class ShardTokens {
 public:
  int64_t size() const { return wide_ ? static_cast<int64_t>(wide_tokens_.size()) : static_cast<int64_t>(narrow_tokens_.size()); }
  bool empty() const { return size() == 0; }
  int32_t operator[](int64_t i) const {
    return wide_ ? static_cast<int32_t>(wide_tokens_[static_cast<size_t>(i)]) : narrow_tokens_[static_cast<size_t>(i)];
  }
  // Copies tokens [begin, begin + count) into `out`.
  void copy_to(int64_t begin, int64_t count, int32_t* out) const;
  std::vector<int32_t> to_vector() const;
  int bytes_per_token() const { return wide_ ? 4 : 2; }

 private:
  friend ShardTokens read_token_shard(const std::string& path, int64_t vocab_size);
  friend ShardTokens parse_token_shard(const uint8_t* data, size_t size, int64_t vocab_size, const std::string& source);
  bool wide_ = false;
  std::vector<uint16_t> narrow_tokens_;
  std::vector<uint32_t> wide_tokens_;
};

// Reads and validates a whole shard of either format: header, file size, and every token <
// vocab_size.
ShardTokens read_token_shard(const std::string& path, int64_t vocab_size);

// The same from a whole shard held in memory; `source` names it in errors. What the file
// readers check, from the bytes (tests/fuzz/ feeds it malformed shards).
ShardTokens parse_token_shard(const uint8_t* data, size_t size, int64_t vocab_size, const std::string& source);

// A shard mapped read-only (mmap) after its header and size are checked: the page cache holds
// what is read, so a data set of any size costs address space, not memory. Token ids are
// checked against the vocabulary as they are copied out, naming the shard and the position.
class MappedShard {
 public:
  MappedShard(const std::string& path, int64_t vocab_size);
  ~MappedShard();
  MappedShard(MappedShard&& other) noexcept;
  MappedShard& operator=(MappedShard&& other) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  int64_t size() const { return tokens_; }
  int bytes_per_token() const { return bytes_per_token_; }
  const std::string& path() const { return path_; }
  // Copies tokens [begin, begin + count) into `out`.
  void copy_to(int64_t begin, int64_t count, int32_t* out) const;

 private:
  void release();
  std::string path_;
  int64_t vocab_size_ = 0;
  int64_t tokens_ = 0;
  int bytes_per_token_ = 2;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

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
