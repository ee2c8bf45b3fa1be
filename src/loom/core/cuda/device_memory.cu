#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/core/cuda/device_memory.hpp"

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
}  // namespace

int visible_device_count() { return visible().count; }

int select_device(int local_rank) {
  const int count = visible().count;
  if (count == 0) return -1;
  const int device = local_rank % count;
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  return device;
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
  LOOM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kKinds[kind]));
}

void device_fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemset(dst, 0, bytes));
}

MemStats device_stats() { return DeviceAllocator::current().stats(); }
void device_reset_peaks() { DeviceAllocator::current().reset_peaks(); }

}  // namespace loom::cuda
