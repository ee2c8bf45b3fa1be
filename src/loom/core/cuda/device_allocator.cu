#include <cuda_runtime.h>

#include <algorithm>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/core/cuda/stream.hpp"
#include "loom/core/error.hpp"

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

StreamBlockPool::StreamId stream_id(cudaStream_t stream) {
  return reinterpret_cast<StreamBlockPool::StreamId>(stream);
}
cudaEvent_t event_of(StreamBlockPool::EventId id) { return reinterpret_cast<cudaEvent_t>(id); }

// The pool's events are CUDA events on this allocator's device.
StreamBlockPool::Events cuda_events(int device) {
  StreamBlockPool::Events events;
  events.record = [device](StreamBlockPool::StreamId stream) {
    DeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream)));
    return reinterpret_cast<StreamBlockPool::EventId>(event);
  };
  events.done = [](StreamBlockPool::EventId id) { return event_done(event_of(id)); };
  events.wait = [](StreamBlockPool::EventId id) {
    LOOM_CUDA_CHECK(cudaEventSynchronize(event_of(id)));
  };
  events.destroy = [](StreamBlockPool::EventId id) { (void)cudaEventDestroy(event_of(id)); };
  return events;
}

}  // namespace

DeviceAllocator::DeviceAllocator(int device)
    : device_(device), pool_(std::make_unique<StreamBlockPool>(cuda_events(device))) {}

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
  return allocate(bytes, category, current_stream());
}

void* DeviceAllocator::allocate(size_t bytes, MemCategory category, cudaStream_t stream) {
  const size_t block = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = pool_->take(block, stream_id(stream));
  if (!ptr) {
    ptr = malloc_on_device(block);
    if (!ptr) {  // the cache may hold enough in other size classes or for other streams
      empty_cache_locked();
      ptr = malloc_on_device(block);
    }
    if (!ptr)
      throw_error("CUDA out of memory on device ", device_, ": ", bytes, " bytes for ",
                  mem_category_name(category), " (", stats_.total_live_bytes, " bytes live, ",
                  reserved_bytes_, " reserved by loom)");
    reserved_bytes_ += static_cast<int64_t>(block);
  }
  pool_->add_live(ptr, block, stream_id(stream));
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
  LOOM_CHECK(pool_->is_live(ptr), "release of a pointer this allocator does not hold");
  const size_t block = pool_->size_class_of(ptr);
  LOOM_CHECK(block == size_class(bytes), "release with ", bytes,
             " bytes of a block allocated in class ", block);
  pool_->release(ptr);
  const auto requested = static_cast<int64_t>(bytes);
  stats_.live_bytes[static_cast<size_t>(category)] -= requested;
  stats_.total_live_bytes -= requested;
}

void DeviceAllocator::record_stream(void* ptr, cudaStream_t stream) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  pool_->record_stream(ptr, stream_id(stream));
}

void DeviceAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  empty_cache_locked();
}

void DeviceAllocator::empty_cache_locked() {
  DeviceGuard guard(device_);
  for (const auto& [ptr, block] : pool_->drain()) {
    LOOM_CUDA_CHECK(cudaFree(ptr));
    reserved_bytes_ -= static_cast<int64_t>(block);
  }
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
  return pool_->cached_bytes();
}
int64_t DeviceAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_bytes_;
}

}  // namespace loom::cuda
