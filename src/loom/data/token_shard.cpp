#include "loom/data/token_shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "loom/core/error.hpp"

namespace loom {

// The format is little-endian; we write and read memory images directly, which is only
// correct on little-endian hosts (x86-64 and ARM64 Linux, all loom targets).
static_assert(std::endian::native == std::endian::little, "token shard I/O assumes a little-endian host");

namespace {

constexpr int64_t kMaxUint16Token = std::numeric_limits<uint16_t>::max();

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd, cursor, bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_error("cannot write token shard '", path, "': ", std::strerror(errno));
    }
    cursor += written;
    bytes -= static_cast<size_t>(written);
  }
}

// Without this the rename itself may be lost on power failure, leaving no shard at all.
void fsync_parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw_error("cannot open directory '", dir, "' to fsync token shard '", path,
                "': ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  if (rc != 0) throw_error("cannot fsync directory '", dir, "': ", std::strerror(fsync_errno));
}

struct ShardHeader {
  int64_t tokens = 0;
  int64_t bytes_per_token = 2;
};

void throw_truncated_header(const std::string& path, int64_t file_bytes) {
  throw_error("token shard '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ",
              kTokenShardHeaderBytes, "-byte header");
}

// The header's token count and width, checked against the magic, the version and the shard's
// size in bytes; `path` names the shard in errors.
ShardHeader checked_header(const int32_t* header, int64_t file_bytes, const std::string& path) {
  ShardHeader shard;
  if (header[0] == kTokenShardMagic) {
    if (header[1] != kTokenShardVersion) {
      throw_error("token shard '", path, "' has version ", header[1], ", expected ", kTokenShardVersion,
                  " (uint16 tokens) with magic ", kTokenShardMagic);
    }
  } else if (header[0] == kWideTokenShardMagic) {
    if (header[1] != kWideTokenShardVersion) {
      throw_error("token shard '", path, "' has version ", header[1], ", expected ", kWideTokenShardVersion,
                  " (uint32 tokens) with magic ", kWideTokenShardMagic);
    }
    shard.bytes_per_token = 4;
  } else {
    throw_error("token shard '", path, "' has magic number ", header[0], ", expected ", kTokenShardMagic,
                " (uint16 tokens) or ", kWideTokenShardMagic,
                " (uint32 tokens) (not an llm.c/loom token shard, or corrupt)");
  }
  shard.tokens = header[2];
  if (shard.tokens < 0)
    throw_error("token shard '", path, "' has a negative token count ", shard.tokens, " in its header");
  const int64_t expected_bytes = kTokenShardHeaderBytes + shard.tokens * shard.bytes_per_token;
  if (file_bytes < expected_bytes) {
    throw_error("token shard '", path, "' is truncated: its header says ", shard.tokens, " tokens (",
                expected_bytes, " bytes in all) but the file has ", file_bytes, " bytes");
  }
  if (file_bytes > expected_bytes) {
    throw_error("token shard '", path, "' has ", file_bytes, " bytes but its header says ", shard.tokens,
                " tokens (", expected_bytes,
                " bytes in all): trailing data, so the file is corrupt or not this format");
  }
  return shard;
}

// Opens `path`, checks the header against the file size and returns the token count and width;
// `in` is left positioned at the first token.
ShardHeader read_checked_header(std::ifstream& in, const std::string& path) {
  in.open(path, std::ios::binary);
  if (!in) throw_error("cannot open token shard '", path, "': ", std::strerror(errno));
  std::error_code error;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  if (error) throw_error("cannot get the size of token shard '", path, "': ", error.message());
  if (file_bytes < kTokenShardHeaderBytes) throw_truncated_header(path, file_bytes);
  int32_t header[kTokenShardHeaderInts];
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    throw_error("cannot read the header of token shard '", path, "'");
  }
  return checked_header(header, file_bytes, path);
}

void check_vocab_size(const std::string& path, int64_t vocab_size) {
  if (vocab_size <= 0)
    throw_error("read_token_shard '", path, "': vocab_size must be positive, got ", vocab_size);
}

template <typename Token>
void check_token_ids(const std::string& path, const std::vector<Token>& tokens, int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int64_t>(tokens[i]) >= vocab_size) {
      throw_error("token shard '", path, "': token ", tokens[i], " at position ", i, " is >= vocab_size ",
                  vocab_size, " (vocabulary mismatch: the shard was made with a different tokenizer)");
    }
  }
}

// loom's ids are int32: a uint32 id above that is never valid, whatever the vocabulary.
int64_t id_limit(int64_t vocab_size) { return std::min<int64_t>(vocab_size, std::numeric_limits<int32_t>::max()); }

template <typename Token>
std::vector<Token> checked_body(const std::string& path, const std::vector<int32_t>& tokens, int64_t limit,
                                const char* format) {
  std::vector<Token> body(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= limit) {
      throw_error("cannot write token shard '", path, "': token ", tokens[i], " at position ", i,
                  " is outside [0, ", limit - 1, "], ", format);
    }
    body[i] = static_cast<Token>(tokens[i]);
  }
  return body;
}

template <typename Token>
void read_body(std::ifstream& in, const std::string& path, int64_t count, int64_t vocab_size,
               std::vector<Token>& tokens) {
  tokens.resize(static_cast<size_t>(count));
  if (!in.read(reinterpret_cast<char*>(tokens.data()), count * static_cast<int64_t>(sizeof(Token)))) {
    throw_error("cannot read the ", count, " tokens of token shard '", path, "' (file changed while reading?)");
  }
  check_token_ids(path, tokens, vocab_size);
}

template <typename Token>
void parse_body(const uint8_t* body, const std::string& path, int64_t count, int64_t vocab_size,
                std::vector<Token>& tokens) {
  tokens.resize(static_cast<size_t>(count));
  if (count > 0) std::memcpy(tokens.data(), body, static_cast<size_t>(count) * sizeof(Token));
  check_token_ids(path, tokens, vocab_size);
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw_error("cannot write token shard '", path, "': ", tokens.size(),
                " tokens do not fit the header's int32 count; split into smaller shards");
  }
  if (vocab_size < 0 || vocab_size > kMaxWideShardVocab) {
    throw_error("cannot write token shard '", path, "': a vocabulary of ", vocab_size,
                " tokens does not fit llm.c's shard formats, whose token ids are at most 32 bits (",
                kMaxWideShardVocab, " tokens)");
  }
  bool wide = vocab_size > kMaxNarrowShardVocab;
  if (vocab_size == 0) wide = std::any_of(tokens.begin(), tokens.end(), [](int32_t t) { return t > kMaxUint16Token; });
  const int64_t limit = vocab_size > 0 ? vocab_size : (wide ? kMaxWideShardVocab : kMaxNarrowShardVocab);
  std::vector<uint16_t> narrow_body;
  std::vector<uint32_t> wide_body;
  if (wide) {
    wide_body = checked_body<uint32_t>(path, tokens, limit, vocab_size > 0 ? "the vocabulary's ids" : "token ids");
  } else {
    narrow_body = checked_body<uint16_t>(path, tokens, limit,
                                         vocab_size > 0 ? "the vocabulary's ids" : "the range of uint16 shards");
  }
  int32_t header[kTokenShardHeaderInts] = {};
  header[0] = wide ? kWideTokenShardMagic : kTokenShardMagic;
  header[1] = wide ? kWideTokenShardVersion : kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const void* body = wide ? static_cast<const void*>(wide_body.data()) : static_cast<const void*>(narrow_body.data());
  const size_t body_bytes = tokens.size() * (wide ? sizeof(uint32_t) : sizeof(uint16_t));

  const std::string temp_path = path + ".tmp";
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw_error("cannot create '", temp_path, "' to write token shard '", path, "': ", std::strerror(errno));
  try {
    write_all(fd, header, sizeof(header), temp_path);
    write_all(fd, body, body_bytes, temp_path);
    if (::fsync(fd) != 0) throw_error("cannot fsync '", temp_path, "': ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
  // close() can report deferred write errors (NFS), so it is checked like a write.
  if (::close(fd) != 0) {
    const int close_errno = errno;
    ::unlink(temp_path.c_str());
    throw_error("cannot close '", temp_path, "': ", std::strerror(close_errno));
  }
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    ::unlink(temp_path.c_str());
    throw_error("cannot rename '", temp_path, "' to '", path, "': ", std::strerror(rename_errno));
  }
  fsync_parent_directory(path);
}

void ShardTokens::copy_to(int64_t begin, int64_t count, int32_t* out) const {
  LOOM_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "copy of [", begin, ", ", begin + count,
             ") from a shard of ", size(), " tokens");
  if (wide_) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(wide_tokens_[static_cast<size_t>(begin + i)]);
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = narrow_tokens_[static_cast<size_t>(begin + i)];
  }
}

std::vector<int32_t> ShardTokens::to_vector() const {
  std::vector<int32_t> tokens(static_cast<size_t>(size()));
  copy_to(0, size(), tokens.data());
  return tokens;
}

ShardTokens read_token_shard(const std::string& path, int64_t vocab_size) {
  check_vocab_size(path, vocab_size);
  std::ifstream in;
  const ShardHeader header = read_checked_header(in, path);
  ShardTokens tokens;
  tokens.wide_ = header.bytes_per_token == 4;
  if (tokens.wide_) {
    read_body(in, path, header.tokens, id_limit(vocab_size), tokens.wide_tokens_);
  } else {
    read_body(in, path, header.tokens, vocab_size, tokens.narrow_tokens_);
  }
  return tokens;
}

ShardTokens parse_token_shard(const uint8_t* data, size_t size, int64_t vocab_size, const std::string& source) {
  check_vocab_size(source, vocab_size);
  const auto file_bytes = static_cast<int64_t>(size);
  if (file_bytes < kTokenShardHeaderBytes) throw_truncated_header(source, file_bytes);
  int32_t header_ints[kTokenShardHeaderInts];
  std::memcpy(header_ints, data, sizeof(header_ints));
  const ShardHeader header = checked_header(header_ints, file_bytes, source);
  ShardTokens tokens;
  tokens.wide_ = header.bytes_per_token == 4;
  const uint8_t* body = data + kTokenShardHeaderBytes;
  if (tokens.wide_) {
    parse_body(body, source, header.tokens, id_limit(vocab_size), tokens.wide_tokens_);
  } else {
    parse_body(body, source, header.tokens, vocab_size, tokens.narrow_tokens_);
  }
  return tokens;
}

MappedShard::MappedShard(const std::string& path, int64_t vocab_size) : path_(path), vocab_size_(vocab_size) {
  check_vocab_size(path, vocab_size);
  std::ifstream in;
  const ShardHeader header = read_checked_header(in, path);
  tokens_ = header.tokens;
  bytes_per_token_ = static_cast<int>(header.bytes_per_token);
  if (bytes_per_token_ == 4) vocab_size_ = id_limit(vocab_size);
  map_bytes_ = static_cast<size_t>(kTokenShardHeaderBytes + tokens_ * header.bytes_per_token);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_error("cannot open token shard '", path, "': ", std::strerror(errno));
  void* map = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) throw_error("cannot map token shard '", path, "' (", map_bytes_, " bytes): ", std::strerror(map_errno));
  map_ = map;
}

MappedShard::~MappedShard() { release(); }

void MappedShard::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
}

MappedShard::MappedShard(MappedShard&& other) noexcept
    : path_(std::move(other.path_)),
      vocab_size_(other.vocab_size_),
      tokens_(other.tokens_),
      bytes_per_token_(other.bytes_per_token_),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(other.map_bytes_) {}

MappedShard& MappedShard::operator=(MappedShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    vocab_size_ = other.vocab_size_;
    tokens_ = other.tokens_;
    bytes_per_token_ = other.bytes_per_token_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = other.map_bytes_;
  }
  return *this;
}

void MappedShard::copy_to(int64_t begin, int64_t count, int32_t* out) const {
  LOOM_CHECK(begin >= 0 && count >= 0 && begin + count <= tokens_, "copy of [", begin, ", ", begin + count,
             ") from token shard '", path_, "' of ", tokens_, " tokens");
  const uint8_t* body = static_cast<const uint8_t*>(map_) + kTokenShardHeaderBytes;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t token;
    if (bytes_per_token_ == 4) {
      std::memcpy(&token, body + (begin + i) * 4, 4);
    } else {
      uint16_t narrow;
      std::memcpy(&narrow, body + (begin + i) * 2, 2);
      token = narrow;
    }
    if (static_cast<int64_t>(token) >= vocab_size_) {
      throw_error("token shard '", path_, "': token ", token, " at position ", begin + i, " is >= vocab_size ",
                  vocab_size_, " (vocabulary mismatch: the shard was made with a different tokenizer)");
    }
    out[i] = static_cast<int32_t>(token);
  }
}

int64_t token_shard_size(const std::string& path) {
  std::ifstream in;
  return read_checked_header(in, path).tokens;
}

LongestDocument longest_document(const std::string& path, int32_t eot_token) {
  std::ifstream in;
  const ShardHeader header = read_checked_header(in, path);
  const int64_t count = header.tokens;
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<char> piece(static_cast<size_t>(std::min(count, kPiece) * header.bytes_per_token));
  const auto token_at = [&](int64_t i) -> int64_t {
    if (header.bytes_per_token == 2) {
      uint16_t t;
      std::memcpy(&t, piece.data() + 2 * i, 2);
      return t;
    }
    uint32_t t;
    std::memcpy(&t, piece.data() + 4 * i, 4);
    return t;
  };
  LongestDocument longest;
  int64_t start = 0;  // first token of the current document
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(kPiece, count - done);
    if (!in.read(piece.data(), n * header.bytes_per_token))
      throw_error("cannot read the ", count, " tokens of token shard '", path, "' (file changed while reading?)");
    for (int64_t i = 0; i < n; ++i) {
      if (token_at(i) != eot_token) continue;
      const int64_t end = done + i + 1;  // one past the end token
      if (end - start > longest.tokens) longest = {end - start, start};
      start = end;
    }
    done += n;
  }
  if (count - start > longest.tokens) longest = {count - start, start};
  return longest;
}

}  // namespace loom
