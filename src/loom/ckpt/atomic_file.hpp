#pragma once
// Durable file primitives for checkpoints. A reader must see either the old file or the new
// one, never a torn mix, even across a crash: write a sibling temp file, fsync it, rename it
// over the target (rename is atomic on POSIX), then fsync the directory so the rename itself
// survives a power loss. Every failure is a loom::Error naming the path and strerror.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

// Replaces `path` atomically with `bytes` of `data`, via `path.tmp.<pid>` in the same directory.
// On failure the temp file is removed and any existing `path` is left untouched.
void atomic_write_file(const std::string& path, const void* data, size_t bytes);
void atomic_write_file(const std::string& path, const std::string& contents);
// The same from several buffers, written one after another (a file assembled without copying).
struct ByteSpan {
  const void* data;
  size_t bytes;
};
void atomic_write_file(const std::string& path, const std::vector<ByteSpan>& spans);

// Makes renames and creations inside `dir` durable.
void fsync_directory(const std::string& dir);

// The whole file; an Error names the path if it cannot be opened or read completely.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace loom
