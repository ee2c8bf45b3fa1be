#include "loom/gpu/device_buffer.hpp"

#include <cuda_runtime.h>

#include <utility>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"

namespace loom::gpu {

DeviceBuffer::DeviceBuffer(size_t bytes, MemCategory category)
    : bytes_(bytes), category_(category) {
  if (bytes_ == 0) return;
  cuda::DeviceAllocator& allocator = cuda::DeviceAllocator::current();
  device_ = allocator.device();
  ptr_ = allocator.allocate(bytes_, category_);
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (!ptr_) return;
  cuda::DeviceAllocator::for_device(device_).release(ptr_, bytes_, category_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::zero() {
  if (ptr_) LOOM_CUDA_CHECK(cudaMemsetAsync(ptr_, 0, bytes_, 0));
}

void copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes > 0) LOOM_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes > 0) LOOM_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
}

void copy_on_device(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes > 0)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, 0));
}

}  // namespace loom::gpu
