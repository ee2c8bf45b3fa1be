#pragma once
// A file read by byte ranges (pread), not whole: how a loading rank takes only its pieces of
// the shard files of a sharded checkpoint. Counts the bytes it reads, so tests can tell.
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class RangedFile {
 public:
  // Opens `path` for reading; a loom::Error names it when it cannot.
  explicit RangedFile(std::string path);
  ~RangedFile();
  RangedFile(const RangedFile&) = delete;
  RangedFile& operator=(const RangedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Bytes [offset, offset + bytes); an Error names the file when the range runs past its end
  // (truncated since it was opened) or the read fails.
  std::vector<uint8_t> read(uint64_t offset, uint64_t bytes) const;
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace loom
