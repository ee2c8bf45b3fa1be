#pragma once
// Host allocator with per-category accounting. Every tensor's bytes belong to one category,
// so a rank can report where its memory goes and tests can compare that with the planner.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

enum class MemCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  Workspace,
  CommBuffers,
  kCount
};
constexpr size_t kMemCategoryCount = static_cast<size_t>(MemCategory::kCount);
const char* mem_category_name(MemCategory category);

struct MemStats {
  std::array<int64_t, kMemCategoryCount> live_bytes{};
  std::array<int64_t, kMemCategoryCount> peak_bytes{};
  int64_t total_live_bytes = 0;
  int64_t total_peak_bytes = 0;
};

// Tells the C library to keep the memory a process frees for its next allocations (glibc:
// no mmap'd chunks, no trimming of the heap, growth in 256 MiB steps) instead of handing it
// back to the kernel and faulting it in again. A training step frees and reallocates the same
// large buffers every micro-batch (ZeRO-2/3's full-size gradients, MPI's reduction scratch),
// and on a virtual machine each page fault costs microseconds: ZeRO-2 on 2 ranks ran 1.7 s a
// step instead of 1.07 s. Like PyTorch's caching allocator, the process then holds its peak.
// Call once, first thing in main; a no-op without glibc or with LOOM_RETAIN_FREED_MEMORY=0.
void retain_freed_host_memory();

class HostAllocator {
 public:
  static constexpr size_t kAlignmentBytes = 64;  // one cache line; also AVX-512 friendly

  static HostAllocator& instance();
  void* allocate(size_t bytes, MemCategory category);
  void release(void* ptr, size_t bytes, MemCategory category);
  // The accounting alone, for host bytes that come from elsewhere (CUDA's pinned memory).
  void count_allocated(size_t bytes, MemCategory category);
  void count_released(size_t bytes, MemCategory category);

  MemStats stats() const;
  int64_t live_bytes(MemCategory category) const;
  int64_t peak_bytes(MemCategory category) const;
  // Starts a new peak window (e.g. per training step) from the current live figures.
  void reset_peaks();

 private:
  std::array<std::atomic<int64_t>, kMemCategoryCount> live_{};
  std::array<std::atomic<int64_t>, kMemCategoryCount> peak_{};
  std::atomic<int64_t> total_live_{0};
  std::atomic<int64_t> total_peak_{0};
};

}  // namespace loom
