#include <cuda_runtime.h>

#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"

namespace loom::cuda {

namespace {

std::mutex g_allocators_mutex;
// Never destroyed, like the cuBLAS contexts: freeing device memory from static destructors
// races the CUDA runtime's own teardown.
std::vector<DeviceAllocator*> g_allocators;

// Runs the calling thread on `device` for the guard's lifetime (cudaMalloc allocates on the
// current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    LOOM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) LOOM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

DeviceAllocator& DeviceAllocator::current() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return for_device(device);
}

DeviceAllocator& DeviceAllocator::for_device(int device) {
  std::lock_guard<std::mutex> lock(g_allocators_mutex);
  LOOM_CHECK(device >= 0, "device ", device);
  if (static_cast<size_t>(device) >= g_allocators.size())
    g_allocators.resize(static_cast<size_t>(device) + 1, nullptr);
  DeviceAllocator*& slot = g_allocators[static_cast<size_t>(device)];
  if (!slot) slot = new DeviceAllocator(device);
  return *slot;
}

size_t DeviceAllocator::size_class(size_t bytes) {
  const size_t round = bytes < kSmallLimitBytes ? kSmallRoundBytes : kLargeRoundBytes;
  return std::max<size_t>(1, (bytes + round - 1) / round) * round;
}

void* DeviceAllocator::malloc_on_device(size_t block_bytes) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, block_bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky, but clear it so later checks do not see it
    return nullptr;
  }
  LOOM_CUDA_CHECK(rc);
  return ptr;
}

void* DeviceAllocator::allocate(size_t bytes, MemCategory category) {
  const size_t block = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto cached = free_blocks_.find(block);
  if (cached != free_blocks_.end() && !cached->second.empty()) {
    ptr = cached->second.back();
    cached->second.pop_back();
    cached_bytes_ -= static_cast<int64_t>(block);
  } else {
    ptr = malloc_on_device(block);
    if (!ptr) {  // the cache may hold enough in other size classes
      empty_cache_locked();
      ptr = malloc_on_device(block);
    }
    if (!ptr)
      throw_error("CUDA out of memory on device ", device_, ": ", bytes, " bytes for ",
                  mem_category_name(category), " (", stats_.total_live_bytes, " bytes live, ",
                  reserved_bytes_, " reserved by loom)");
    reserved_bytes_ += static_cast<int64_t>(block);
  }
  live_blocks_[ptr] = block;
  const auto index = static_cast<size_t>(category);
  const auto requested = static_cast<int64_t>(bytes);
  stats_.live_bytes[index] += requested;
  stats_.peak_bytes[index] = std::max(stats_.peak_bytes[index], stats_.live_bytes[index]);
  stats_.total_live_bytes += requested;
  stats_.total_peak_bytes = std::max(stats_.total_peak_bytes, stats_.total_live_bytes);
  return ptr;
}

void DeviceAllocator::release(void* ptr, size_t bytes, MemCategory category) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto live = live_blocks_.find(ptr);
  LOOM_CHECK(live != live_blocks_.end(), "release of a pointer this allocator does not hold");
  LOOM_CHECK(live->second == size_class(bytes), "release with ", bytes,
             " bytes of a block allocated in class ", live->second);
  free_blocks_[live->second].push_back(ptr);
  cached_bytes_ += static_cast<int64_t>(live->second);
  live_blocks_.erase(live);
  const auto requested = static_cast<int64_t>(bytes);
  stats_.live_bytes[static_cast<size_t>(category)] -= requested;
  stats_.total_live_bytes -= requested;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  empty_cache_locked();
}

void DeviceAllocator::empty_cache_locked() {
  DeviceGuard guard(device_);
  for (auto& [block, pointers] : free_blocks_) {
    for (void* ptr : pointers) LOOM_CUDA_CHECK(cudaFree(ptr));
    reserved_bytes_ -= static_cast<int64_t>(block * pointers.size());
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

MemStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}
int64_t DeviceAllocator::live_bytes(MemCategory category) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.live_bytes[static_cast<size_t>(category)];
}
int64_t DeviceAllocator::peak_bytes(MemCategory category) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.peak_bytes[static_cast<size_t>(category)];
}
void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.total_peak_bytes = stats_.total_live_bytes;
}
int64_t DeviceAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}
int64_t DeviceAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_bytes_;
}

}  // namespace loom::cuda
