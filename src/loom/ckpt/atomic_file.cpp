#include "loom/ckpt/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "loom/core/error.hpp"

namespace loom {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes the descriptor on every exit path; close() errors on the success path are checked
// explicitly by the caller, since NFS and friends may report write errors only at close.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* cursor = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    const ssize_t written = ::write(fd, cursor, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_error("cannot write '", path, "': ", errno_text());
    }
    cursor += written;
    left -= static_cast<size_t>(written);
  }
}

std::string parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void fsync_directory(const std::string& dir) {
  FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_error("cannot open directory '", dir, "' to fsync it: ", errno_text());
  if (::fsync(fd.get()) != 0) throw_error("cannot fsync directory '", dir, "': ", errno_text());
}

void atomic_write_file(const std::string& path, const void* data, size_t bytes) {
  atomic_write_file(path, std::vector<ByteSpan>{{data, bytes}});
}

void atomic_write_file(const std::string& path, const std::vector<ByteSpan>& spans) {
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  FileDescriptor fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw_error("cannot create '", temp_path, "' (to replace '", path, "'): ", errno_text());
  try {
    for (const ByteSpan& span : spans) write_all(fd.get(), span.data, span.bytes, temp_path);
    if (::fsync(fd.get()) != 0) throw_error("cannot fsync '", temp_path, "': ", errno_text());
    if (::close(fd.release()) != 0) throw_error("cannot close '", temp_path, "': ", errno_text());
    if (::rename(temp_path.c_str(), path.c_str()) != 0)
      throw_error("cannot rename '", temp_path, "' to '", path, "': ", errno_text());
  } catch (...) {
    ::unlink(temp_path.c_str());
    throw;
  }
  fsync_directory(parent_directory(path));
}

void atomic_write_file(const std::string& path, const std::string& contents) {
  atomic_write_file(path, contents.data(), contents.size());
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_error("cannot open '", path, "': ", errno_text());
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw_error("cannot stat '", path, "': ", errno_text());
  if (!S_ISREG(info.st_mode)) throw_error("'", path, "' is not a regular file");
  std::vector<uint8_t> bytes(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_error("cannot read '", path, "': ", errno_text());
    }
    if (got == 0) throw_error("'", path, "' shrank while being read (", done, " of ", bytes.size(), " bytes)");
    done += static_cast<size_t>(got);
  }
  return bytes;
}

}  // namespace loom
