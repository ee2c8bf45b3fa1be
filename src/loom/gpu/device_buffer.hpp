#pragma once
// Device memory owned by one object, taken from the caching DeviceAllocator under a memory
// category, so the GPU trainer reports where its memory goes by the same categories as the CPU
// engine (and a buffer that dies goes back to the allocator's cache, not to cudaFree). Untyped:
// the model keeps one set of activation buffers and reads them as f32 or bf16 by its compute
// dtype.
//
// Every user runs on the default stream, so a released block the allocator hands out again is
// only touched after the kernels that used it (stream order; see device_allocator.hpp).
#include <cstddef>
#include <cstdint>

#include "loom/core/allocator.hpp"

namespace loom::gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, MemCategory category);  // on the current device; 0 bytes: empty
  template <typename T>
  static DeviceBuffer of(int64_t count, MemCategory category) {
    return DeviceBuffer(static_cast<size_t>(count) * sizeof(T), category);
  }
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool defined() const { return ptr_ != nullptr; }
  void zero();  // queued on the default stream

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::Workspace;
  int device_ = 0;
};

// Copies on the default stream. Host <-> device copies of pageable memory return when the
// copy is done, after every kernel queued before them; device -> device copies are queued.
void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void copy_on_device(void* device_dst, const void* device_src, size_t bytes);

}  // namespace loom::gpu
