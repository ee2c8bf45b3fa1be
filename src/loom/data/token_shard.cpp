#include "loom/data/token_shard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

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

// The header's token count, checked against the magic, the version and the shard's size in
// bytes; `path` names the shard in errors.
int64_t checked_token_count(const int32_t* header, int64_t file_bytes, const std::string& path) {
  if (header[0] != kTokenShardMagic) {
    throw_error("token shard '", path, "' has magic number ", header[0], ", expected ", kTokenShardMagic,
                " (not an llm.c/loom token shard, or corrupt)");
  }
  if (header[1] != kTokenShardVersion) {
    throw_error("token shard '", path, "' has version ", header[1], ", expected ", kTokenShardVersion,
                " (uint16 tokens; llm.c's version 2 stores uint32 LLaMA-3 tokens, which loom does not read)");
  }
  const int64_t tokens = header[2];
  if (tokens < 0)
    throw_error("token shard '", path, "' has a negative token count ", tokens, " in its header");
  const int64_t expected_bytes = kTokenShardHeaderBytes + tokens * static_cast<int64_t>(sizeof(uint16_t));
  if (file_bytes < expected_bytes) {
    throw_error("token shard '", path, "' is truncated: its header says ", tokens, " tokens (",
                expected_bytes, " bytes in all) but the file has ", file_bytes, " bytes");
  }
  if (file_bytes > expected_bytes) {
    throw_error("token shard '", path, "' has ", file_bytes, " bytes but its header says ", tokens,
                " tokens (", expected_bytes,
                " bytes in all): trailing data, so the file is corrupt or not this format");
  }
  return tokens;
}

void throw_truncated_header(const std::string& path, int64_t file_bytes) {
  throw_error("token shard '", path, "' is truncated: ", file_bytes, " bytes, shorter than the ",
              kTokenShardHeaderBytes, "-byte header");
}

void check_vocab_size(const std::string& path, int64_t vocab_size) {
  if (vocab_size <= 0)
    throw_error("read_token_shard '", path, "': vocab_size must be positive, got ", vocab_size);
}

void check_token_ids(const std::vector<uint16_t>& tokens, int64_t vocab_size, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw_error("token shard '", path, "': token ", tokens[i], " at position ", i, " is >= vocab_size ",
                  vocab_size, " (vocabulary mismatch: the shard was made with a different tokenizer)");
    }
  }
}

// Opens `path`, checks the header against the file size and returns the token count; `in` is
// left positioned at the first token.
int64_t read_checked_header(std::ifstream& in, const std::string& path) {
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
  return checked_token_count(header, file_bytes, path);
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw_error("cannot write token shard '", path, "': ", tokens.size(),
                " tokens do not fit the header's int32 count; split into smaller shards");
  }
  std::vector<uint16_t> body(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > kMaxUint16Token) {
      throw_error("cannot write token shard '", path, "': token ", tokens[i], " at position ", i,
                  " is outside [0, ", kMaxUint16Token, "], the range of version-1 (uint16) shards");
    }
    body[i] = static_cast<uint16_t>(tokens[i]);
  }
  int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string temp_path = path + ".tmp";
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw_error("cannot create '", temp_path, "' to write token shard '", path, "': ", std::strerror(errno));
  try {
    write_all(fd, header, sizeof(header), temp_path);
    write_all(fd, body.data(), body.size() * sizeof(uint16_t), temp_path);
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

std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size) {
  check_vocab_size(path, vocab_size);
  std::ifstream in;
  const int64_t count = read_checked_header(in, path);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  if (!in.read(reinterpret_cast<char*>(tokens.data()), count * static_cast<int64_t>(sizeof(uint16_t)))) {
    throw_error("cannot read the ", count, " tokens of token shard '", path,
                "' (file changed while reading?)");
  }
  check_token_ids(tokens, vocab_size, path);
  return tokens;
}

std::vector<uint16_t> parse_token_shard(const uint8_t* data, size_t size, int64_t vocab_size, const std::string& source) {
  check_vocab_size(source, vocab_size);
  const auto file_bytes = static_cast<int64_t>(size);
  if (file_bytes < kTokenShardHeaderBytes) throw_truncated_header(source, file_bytes);
  int32_t header[kTokenShardHeaderInts];
  std::memcpy(header, data, sizeof(header));
  const int64_t count = checked_token_count(header, file_bytes, source);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  if (count > 0) std::memcpy(tokens.data(), data + kTokenShardHeaderBytes, tokens.size() * sizeof(uint16_t));
  check_token_ids(tokens, vocab_size, source);
  return tokens;
}

int64_t token_shard_size(const std::string& path) {
  std::ifstream in;
  return read_checked_header(in, path);
}

LongestDocument longest_document(const std::string& path, int32_t eot_token) {
  std::ifstream in;
  const int64_t count = read_checked_header(in, path);
  constexpr int64_t kPiece = int64_t{1} << 20;
  std::vector<uint16_t> piece(static_cast<size_t>(std::min(count, kPiece)));
  LongestDocument longest;
  int64_t start = 0;  // first token of the current document
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(kPiece, count - done);
    if (!in.read(reinterpret_cast<char*>(piece.data()), n * static_cast<int64_t>(sizeof(uint16_t))))
      throw_error("cannot read the ", count, " tokens of token shard '", path, "' (file changed while reading?)");
    for (int64_t i = 0; i < n; ++i) {
      if (piece[static_cast<size_t>(i)] != eot_token) continue;
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
