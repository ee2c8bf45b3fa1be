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
// Streams (core/stream_block_pool): a block belongs to the stream it was allocated on, the
// calling thread's current stream (core/cuda/stream), and is cached for that stream alone, so a
// released block may be handed out again at once: its next user queues behind the kernels
// that used it. A block that work on other streams uses too (record_stream) is cached only
// once an event recorded on each of them at its release has completed.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "loom/core/allocator.hpp"
#include "loom/core/stream_block_pool.hpp"

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

  // A block for work on `stream` (by default the calling thread's current stream).
  void* allocate(size_t bytes, MemCategory category);
  void* allocate(size_t bytes, MemCategory category, cudaStream_t stream);
  // `bytes` and `category` must be those given to allocate.
  void release(void* ptr, size_t bytes, MemCategory category);
  // Work queued on `stream` uses the live block `ptr` as well as its own stream's: on release
  // it is cached only once that work has run (PyTorch's recordStream).
  void record_stream(void* ptr, cudaStream_t stream);
  // Returns every cached (free) block to CUDA, after the streams still using released blocks
  // have finished with them.
  void empty_cache();

  MemStats stats() const;
  int64_t live_bytes(MemCategory category) const;
  int64_t peak_bytes(MemCategory category) const;
  void reset_peaks();
  int64_t cached_bytes() const;    // released, not live: cached, or waiting for other streams
  int64_t reserved_bytes() const;  // held from cudaMalloc: live blocks + cached blocks
  int device() const { return device_; }

 private:
  explicit DeviceAllocator(int device);
  void* malloc_on_device(size_t block_bytes);  // cudaMalloc, nullptr when out of memory
  void empty_cache_locked();

  int device_;
  mutable std::mutex mutex_;
  std::unique_ptr<StreamBlockPool> pool_;  // cached and live blocks by stream
  MemStats stats_;
  int64_t reserved_bytes_ = 0;
};

}  // namespace loom::cuda
