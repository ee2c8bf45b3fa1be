#include "loom/ckpt/ranged_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/core/error.hpp"

namespace loom {

RangedFile::RangedFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_error("cannot open '", path_, "': ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    const std::string reason = S_ISREG(info.st_mode) ? std::strerror(errno) : "not a regular file";
    ::close(fd_);
    throw_error("cannot read '", path_, "': ", reason);
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

RangedFile::~RangedFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<uint8_t> RangedFile::read(uint64_t offset, uint64_t bytes) const {
  if (offset > size_ || bytes > size_ - offset)
    throw_error("'", path_, "' is ", size_, " bytes, too short for bytes [", offset, ", ",
                offset + bytes, "): the file is truncated");
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_error("cannot read '", path_, "': ", std::strerror(errno));
    }
    if (got == 0)
      throw_error("'", path_, "' shrank while being read (", offset + done, " of ", offset + bytes,
                  " bytes)");
    done += static_cast<size_t>(got);
  }
  bytes_read_ += bytes;
  return out;
}

}  // namespace loom
