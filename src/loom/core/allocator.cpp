#include "loom/core/allocator.hpp"

#include <cstdlib>
#include <new>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace loom {

const char* mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::Activations: return "activations";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::CommBuffers: return "comm_buffers";
    case MemCategory::kCount: break;
  }
  return "unknown";
}

void retain_freed_host_memory() {
#if defined(__GLIBC__)
  if (const char* off = std::getenv("LOOM_RETAIN_FREED_MEMORY"); off && std::string(off) == "0") return;
  mallopt(M_MMAP_MAX, 0);                 // large blocks from the heap, which keeps them
  mallopt(M_TRIM_THRESHOLD, 1 << 30);     // only a free gigabyte at the top goes back
  mallopt(M_TOP_PAD, 256 << 20);          // and the heap grows in big steps
#endif
}

HostAllocator& HostAllocator::instance() {
  static HostAllocator allocator;
  return allocator;
}

static void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void* HostAllocator::allocate(size_t bytes, MemCategory category) {
  const size_t rounded = (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  void* ptr = std::aligned_alloc(kAlignmentBytes, rounded == 0 ? kAlignmentBytes : rounded);
  if (!ptr) throw std::bad_alloc();
  count_allocated(bytes, category);
  return ptr;
}

void HostAllocator::count_allocated(size_t bytes, MemCategory category) {
  const auto index = static_cast<size_t>(category);
  const int64_t live = live_[index].fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  raise_peak(peak_[index], live);
  const int64_t total = total_live_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  raise_peak(total_peak_, total);
}

void HostAllocator::release(void* ptr, size_t bytes, MemCategory category) {
  std::free(ptr);
  count_released(bytes, category);
}

void HostAllocator::count_released(size_t bytes, MemCategory category) {
  live_[static_cast<size_t>(category)].fetch_sub(static_cast<int64_t>(bytes));
  total_live_.fetch_sub(static_cast<int64_t>(bytes));
}

MemStats HostAllocator::stats() const {
  MemStats out;
  for (size_t i = 0; i < kMemCategoryCount; ++i) {
    out.live_bytes[i] = live_[i].load();
    out.peak_bytes[i] = peak_[i].load();
  }
  out.total_live_bytes = total_live_.load();
  out.total_peak_bytes = total_peak_.load();
  return out;
}

int64_t HostAllocator::live_bytes(MemCategory category) const {
  return live_[static_cast<size_t>(category)].load();
}
int64_t HostAllocator::peak_bytes(MemCategory category) const {
  return peak_[static_cast<size_t>(category)].load();
}

void HostAllocator::reset_peaks() {
  for (size_t i = 0; i < kMemCategoryCount; ++i) peak_[i].store(live_[i].load());
  total_peak_.store(total_live_.load());
}

}  // namespace loom
