// Pinned host communication buffers (the MPI backend's staging of device tensors); DeviceAllocator accounting (live/peak per category, like HostAllocator), block reuse and
// empty_cache; and device_info's view of the GPU the other tests run on.
#include <gtest/gtest.h>

#include "gpu_test_support.hpp"
#include "loom/core/cuda/device_allocator.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/tensor.hpp"

namespace loom::cuda::test {
namespace {

class CudaAllocatorTest : public CudaTest {};

TEST_F(CudaAllocatorTest, DeviceInfoDescribesTheDevice) {
  const DeviceInfo info = device_info();
  ASSERT_GT(info.count, 0);
  ASSERT_EQ(info.devices.size(), static_cast<size_t>(info.count));
  EXPECT_GT(info.driver_version, 0);
  EXPECT_FALSE(info.devices[0].name.empty());
  EXPECT_GE(info.devices[0].compute_major, 8) << "built for sm_80 and sm_90 only";
  EXPECT_GT(info.devices[0].total_memory_bytes, 0);
}

// Once a process computes on a GPU, its host communication buffers are page-locked (CUDA
// reports them as host memory it registered), still counted as comm_buffers, and reused.
TEST_F(CudaAllocatorTest, HostCommBuffersArePinnedCountedAndReused) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  const int64_t before = HostAllocator::instance().live_bytes(MemCategory::CommBuffers);
  void* first = nullptr;
  {
    const Tensor staging = Tensor::empty({1000}, DType::F32, MemCategory::CommBuffers);
    first = staging.raw();
    cudaPointerAttributes attributes{};
    LOOM_CUDA_CHECK(cudaPointerGetAttributes(&attributes, staging.raw()));
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "not page-locked";
    EXPECT_EQ(HostAllocator::instance().live_bytes(MemCategory::CommBuffers) - before, 4000);
    // A device round trip through it.
    const Tensor values = Tensor::zeros({1000}, DType::F32, MemCategory::Workspace);
    values.f32()[999] = 7.0f;
    staging.copy_from(values.to(Device::CUDA, MemCategory::Workspace));
    EXPECT_EQ(staging.f32()[999], 7.0f);
  }
  EXPECT_EQ(HostAllocator::instance().live_bytes(MemCategory::CommBuffers), before);
  const Tensor again = Tensor::empty({900}, DType::F32, MemCategory::CommBuffers);
  EXPECT_EQ(again.raw(), first) << "the freed block is taken again";
  // Other host categories stay pageable.
  const Tensor workspace = Tensor::empty({1000}, DType::F32, MemCategory::Workspace);
  cudaPointerAttributes attributes{};
  LOOM_CUDA_CHECK(cudaPointerGetAttributes(&attributes, workspace.raw()));
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
}

TEST_F(CudaAllocatorTest, SizeClassesRoundUp) {
  EXPECT_EQ(DeviceAllocator::size_class(0), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(1), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(513), 1024u);
  EXPECT_EQ(DeviceAllocator::size_class((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(DeviceAllocator::size_class(1u << 20), 2u << 20);
  EXPECT_EQ(DeviceAllocator::size_class((2u << 20) + 1), 4u << 20);
}

TEST_F(CudaAllocatorTest, AccountingMatchesRequestsPerCategory) {
  DeviceAllocator& alloc = DeviceAllocator::current();
  alloc.empty_cache();
  alloc.reset_peaks();
  const MemStats before = alloc.stats();
  const auto index = [](MemCategory c) { return static_cast<size_t>(c); };

  void* params = alloc.allocate(1000, MemCategory::Parameters);
  void* grads = alloc.allocate(3u << 20, MemCategory::Gradients);
  void* acts = alloc.allocate(4096, MemCategory::Activations);
  MemStats now = alloc.stats();
  EXPECT_EQ(now.live_bytes[index(MemCategory::Parameters)] -
                before.live_bytes[index(MemCategory::Parameters)],
            1000);
  EXPECT_EQ(now.live_bytes[index(MemCategory::Gradients)] -
                before.live_bytes[index(MemCategory::Gradients)],
            3 << 20);
  EXPECT_EQ(now.live_bytes[index(MemCategory::Activations)] -
                before.live_bytes[index(MemCategory::Activations)],
            4096);
  EXPECT_EQ(now.total_live_bytes - before.total_live_bytes, 1000 + (3 << 20) + 4096);
  EXPECT_EQ(alloc.cached_bytes(), 0);

  // The memory is real device memory: write and read it back.
  const std::vector<float> pattern = random_vector(250, 1);
  LOOM_CUDA_CHECK(cudaMemcpy(params, pattern.data(), 1000, cudaMemcpyHostToDevice));
  std::vector<float> back(250);
  LOOM_CUDA_CHECK(cudaMemcpy(back.data(), params, 1000, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, pattern);

  alloc.release(acts, 4096, MemCategory::Activations);
  now = alloc.stats();
  EXPECT_EQ(now.live_bytes[index(MemCategory::Activations)],
            before.live_bytes[index(MemCategory::Activations)]);
  EXPECT_EQ(now.peak_bytes[index(MemCategory::Activations)] -
                before.live_bytes[index(MemCategory::Activations)],
            4096);
  EXPECT_EQ(now.total_peak_bytes - before.total_live_bytes, 1000 + (3 << 20) + 4096);
  EXPECT_EQ(alloc.cached_bytes(), 4096);

  // Same size class: the cached block comes back without a cudaMalloc.
  const int64_t reserved = alloc.reserved_bytes();
  void* again = alloc.allocate(4000, MemCategory::Workspace);
  EXPECT_EQ(again, acts);
  EXPECT_EQ(alloc.reserved_bytes(), reserved);
  EXPECT_EQ(alloc.cached_bytes(), 0);
  EXPECT_EQ(
      alloc.live_bytes(MemCategory::Workspace) - before.live_bytes[index(MemCategory::Workspace)],
      4000);

  alloc.release(again, 4000, MemCategory::Workspace);
  alloc.release(grads, 3u << 20, MemCategory::Gradients);
  alloc.release(params, 1000, MemCategory::Parameters);
  now = alloc.stats();
  EXPECT_EQ(now.total_live_bytes, before.total_live_bytes);
  // Cached blocks are whole size classes: 1024 (1000 B), 4 MiB (3 MiB) and 4096.
  const int64_t cached = 1024 + (4 << 20) + 4096;
  EXPECT_EQ(alloc.cached_bytes(), cached);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.stats().total_peak_bytes, before.total_live_bytes);

  alloc.empty_cache();
  EXPECT_EQ(alloc.cached_bytes(), 0);
  EXPECT_EQ(alloc.reserved_bytes(), reserved - cached);
}

TEST_F(CudaAllocatorTest, ReleasingAForeignPointerIsAnError) {
  int on_host = 0;
  EXPECT_THROW(DeviceAllocator::current().release(&on_host, 4, MemCategory::Workspace), Error);
}

}  // namespace
}  // namespace loom::cuda::test
