#pragma once
// A safetensors file written straight from the tensors' memory: each tensor's bytes may lie in
// several spans (a rank's pieces of one tensor), written one after another, so nothing is
// copied in user space. The file is byte for byte what serialize_safetensors makes of the same
// tensors (sorted by name, packed, loom's CRC32 of each under "__metadata__"); the checkpoint
// writers use it for shards and, from the asynchronous saver's host snapshot, single files.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/ckpt/atomic_file.hpp"

namespace loom {

struct TensorSpans {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", "I64"
  std::vector<int64_t> shape;
  std::vector<ByteSpan> spans;  // together the tensor's bytes, row-major
};

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // of the whole file, for the checkpoint manifest
};

// Atomically (atomic_write_file) writes `path`. Throws, before touching the disk, what
// serialize_safetensors throws for the same input (byte counts against dtype and shape,
// repeated or invalid names, reserved metadata keys).
WrittenFile write_safetensors_spans(const std::string& path, std::vector<TensorSpans> tensors,
                                    const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
