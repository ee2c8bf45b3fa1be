#include "loom/core/device_memory.hpp"

#include <cstring>

#include "loom/core/error.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/core/cuda/device_memory.hpp"
#endif

namespace loom::device_memory {

#ifndef LOOM_HAVE_CUDA
namespace {
[[noreturn]] void not_built(Device device) {
  throw_error(
      "device '", device_name(device),
      "' is not built into this loom (it was configured without CUDA: install the CUDA toolkit "
      "and rebuild, or set train.device = \"cpu\")");
}
}  // namespace
#endif

bool built_with(Device device) {
#ifdef LOOM_HAVE_CUDA
  (void)device;
  return true;
#else
  return device == Device::CPU;
#endif
}

int cuda_device_count() {
#ifdef LOOM_HAVE_CUDA
  return cuda::visible_device_count();
#else
  return 0;
#endif
}

int cuda_min_compute_capability() {
#ifdef LOOM_HAVE_CUDA
  return cuda::min_compute_capability();
#else
  return 0;
#endif
}

int select_cuda_device(int local_rank) {
#ifdef LOOM_HAVE_CUDA
  return cuda::select_device(local_rank);
#else
  (void)local_rank;
  return -1;
#endif
}

void* allocate(Device device, size_t bytes, MemCategory category) {
#ifdef LOOM_HAVE_CUDA
  // Host communication buffers of a process that computes on a GPU are what the MPI backend
  // stages device tensors through: page-locked, so those copies run at full bus speed.
  if (device == Device::CPU && category == MemCategory::CommBuffers)
    if (void* pinned = cuda::pinned_host_allocate(bytes)) {
      HostAllocator::instance().count_allocated(bytes, category);
      return pinned;
    }
#endif
  if (device == Device::CPU) return HostAllocator::instance().allocate(bytes, category);
#ifdef LOOM_HAVE_CUDA
  return cuda::device_allocate(bytes, category);
#else
  not_built(device);
#endif
}

void release(Device device, void* ptr, size_t bytes, MemCategory category) {
#ifdef LOOM_HAVE_CUDA
  if (device == Device::CPU && category == MemCategory::CommBuffers && cuda::pinned_host_release(ptr))
    return HostAllocator::instance().count_released(bytes, category);
#endif
  if (device == Device::CPU) return HostAllocator::instance().release(ptr, bytes, category);
#ifdef LOOM_HAVE_CUDA
  cuda::device_release(ptr, bytes, category);
#else
  (void)ptr, (void)bytes, (void)category;
  not_built(device);
#endif
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    if (bytes) std::memmove(dst, src, bytes);
    return;
  }
#ifdef LOOM_HAVE_CUDA
  const int kind = src_device == Device::CPU ? 0 : dst_device == Device::CPU ? 1 : 2;
  cuda::device_copy(dst, src, bytes, kind);
#else
  (void)dst, (void)src, (void)bytes;
  not_built(dst_device == Device::CPU ? src_device : dst_device);
#endif
}

void fill_zero(void* dst, Device device, size_t bytes) {
  if (device == Device::CPU) {
    if (bytes) std::memset(dst, 0, bytes);
    return;
  }
#ifdef LOOM_HAVE_CUDA
  cuda::device_fill_zero(dst, bytes);
#else
  (void)dst, (void)bytes;
  not_built(device);
#endif
}

void synchronize(Device device) {
  if (device == Device::CPU) return;
#ifdef LOOM_HAVE_CUDA
  cuda::device_synchronize();
#else
  not_built(device);
#endif
}

void synchronize_stream(Device device) {
  if (device == Device::CPU) return;
#ifdef LOOM_HAVE_CUDA
  cuda::current_stream_synchronize();
#else
  not_built(device);
#endif
}

MemStats stats(Device device) {
  if (device == Device::CPU) return HostAllocator::instance().stats();
#ifdef LOOM_HAVE_CUDA
  return cuda::device_stats();
#else
  not_built(device);
#endif
}

void reset_peaks(Device device) {
  if (device == Device::CPU) return HostAllocator::instance().reset_peaks();
#ifdef LOOM_HAVE_CUDA
  cuda::device_reset_peaks();
#else
  not_built(device);
#endif
}

}  // namespace loom::device_memory
