#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/core/cuda/device_memory.hpp"
#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

namespace {
struct Visible {
  int count = 0;
  cudaError_t error = cudaSuccess;
};
const Visible& visible() {
  static const Visible v = [] {
    Visible out;
    out.error = cudaGetDeviceCount(&out.count);
    if (out.error != cudaSuccess) out.count = 0;
    (void)cudaGetLastError();  // a failed query must not poison the next CUDA call
    return out;
  }();
  return v;
}

// The pinned host blocks: free ones by size, and the size of every block handed out.
struct PinnedCache {
  std::mutex mutex;
  bool device_selected = false;
  std::multimap<size_t, void*> free_blocks;
  std::unordered_map<void*, size_t> in_use;
};
PinnedCache& pinned() {
  static PinnedCache* cache = new PinnedCache;  // outlives every static Tensor at exit
  return *cache;
}
}  // namespace

int visible_device_count() { return visible().count; }

int min_compute_capability() {
  const int count = visible().count;
  int lowest = 0;
  for (int d = 0; d < count; ++d) {
    int major = 0, minor = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d));
    const int cc = 10 * major + minor;
    lowest = d == 0 ? cc : std::min(lowest, cc);
  }
  return lowest;
}

int select_device(int local_rank) {
  const int count = visible().count;
  if (count == 0) return -1;
  const int device = local_rank % count;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  std::lock_guard<std::mutex> lock(pinned().mutex);
  pinned().device_selected = true;
  return device;
}

void* pinned_host_allocate(size_t bytes) {
  PinnedCache& cache = pinned();
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (!cache.device_selected) return nullptr;
  // Blocks are 64 KiB multiples; a free block up to twice the request is taken as it is.
  constexpr size_t kGranule = size_t{64} << 10;
  const size_t size = (bytes + kGranule - 1) / kGranule * kGranule + (bytes == 0 ? kGranule : 0);
  auto it = cache.free_blocks.lower_bound(size);
  void* ptr = nullptr;
  size_t block = size;
  if (it != cache.free_blocks.end() && it->first <= 2 * size) {
    block = it->first;
    ptr = it->second;
    cache.free_blocks.erase(it);
  } else if (cudaHostAlloc(&ptr, size, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();  // out of page-locked memory: the caller falls back to pageable
    return nullptr;
  }
  cache.in_use.emplace(ptr, block);
  return ptr;
}

bool pinned_host_release(void* ptr) {
  PinnedCache& cache = pinned();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto it = cache.in_use.find(ptr);
  if (it == cache.in_use.end()) return false;
  cache.free_blocks.emplace(it->second, ptr);
  cache.in_use.erase(it);
  return true;
}

void* device_allocate(size_t bytes, MemCategory category) {
  if (visible().count == 0)
    throw_error("device 'cuda': no CUDA device is visible to this process (",
                visible().error == cudaSuccess ? "the runtime found none"
                                               : cudaGetErrorString(visible().error),
                "); run on a machine with a GPU, or set train.device = \"cpu\"");
  return DeviceAllocator::current().allocate(bytes, category);
}

void device_release(void* ptr, size_t bytes, MemCategory category) {
  DeviceAllocator::current().release(ptr, bytes, category);
}

void device_copy(void* dst, const void* src, size_t bytes, int kind) {
  static constexpr cudaMemcpyKind kKinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                              cudaMemcpyDeviceToDevice};
  LOOM_CHECK(kind >= 0 && kind <= 2, "copy kind ", kind);
  if (bytes == 0) return;
  // On the current stream, behind the kernels that wrote `src` or read `dst` there. A copy to
  // or from the host returns once done, as cudaMemcpy does (the host may reuse or read its
  // buffer, pinned or not); one within the device is queued, as cudaMemcpy's is.
  const cudaStream_t stream = current_stream();
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kKinds[kind], stream));
  if (kind != 2) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void device_fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_stream()));
}

void device_synchronize() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }
void current_stream_synchronize() { LOOM_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

MemStats device_stats() { return DeviceAllocator::current().stats(); }
void device_reset_peaks() { DeviceAllocator::current().reset_peaks(); }

}  // namespace loom::cuda
