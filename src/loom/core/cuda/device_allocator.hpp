#pragma once
// Caching device allocator with the per-category accounting of loom::HostAllocator. cudaMalloc
// and cudaFree synchronise the device and cost tens of microseconds, far too much per tensor
// per step, so released blocks go to a free list per size class and serve later requests of
// that class; cudaMalloc runs only on a miss (and, after an out-of-memory, once more after
// the cache is emptied).
//
// Live and peak figures count requested bytes, as HostAllocator does; reserved_bytes() is what
// the device really holds (rounded blocks, cached ones included).
//
// Streams: a released block may be handed out again at once. That is safe when the next user
// runs on the same stream as the last one (stream order); work on several streams must
// synchronise before releasing a block another stream may reuse.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "loom/core/allocator.hpp"

namespace loom::cuda {

class DeviceAllocator {
 public:
  // Blocks below 1 MiB round up to 512 bytes (cudaMalloc's own granularity for small
  // allocations is 512 B), larger ones to 2 MiB (the driver's large-page size), so a few dozen
  // classes cover a training step's tensors.
  static constexpr size_t kSmallLimitBytes = size_t{1} << 20;
  static constexpr size_t kSmallRoundBytes = 512;
  static constexpr size_t kLargeRoundBytes = size_t{2} << 20;

  // The allocator of the current device (cudaGetDevice), or of `device`.
  static DeviceAllocator& current();
  static DeviceAllocator& for_device(int device);
  static size_t size_class(size_t bytes);

  void* allocate(size_t bytes, MemCategory category);
  // `bytes` and `category` must be those given to allocate.
  void release(void* ptr, size_t bytes, MemCategory category);
  // Returns every cached (free) block to CUDA.
  void empty_cache();

  MemStats stats() const;
  int64_t live_bytes(MemCategory category) const;
  int64_t peak_bytes(MemCategory category) const;
  void reset_peaks();
  int64_t cached_bytes() const;    // in the free lists
  int64_t reserved_bytes() const;  // held from cudaMalloc: live blocks + cached blocks
  int device() const { return device_; }

 private:
  explicit DeviceAllocator(int device) : device_(device) {}
  void* malloc_on_device(size_t block_bytes);  // cudaMalloc, nullptr when out of memory
  void empty_cache_locked();

  int device_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // size class -> blocks
  std::unordered_map<void*, size_t> live_blocks_;               // pointer -> size class
  MemStats stats_;
  int64_t cached_bytes_ = 0, reserved_bytes_ = 0;
};

}  // namespace loom::cuda
