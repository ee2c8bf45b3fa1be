#pragma once
// Bytes on a device, for Storage and Tensor: allocation with per-category accounting, copies
// between any two devices, and zero fill. The CPU is always here (HostAllocator); CUDA is
// here when loom is built with it (core/cuda: the caching DeviceAllocator, cudaMemcpy), and
// otherwise every CUDA request is refused with a loom::Error saying so.
//
// Copies and fills wait for the device (they are synchronous): what moves through here is
// setup, checkpoints and tests. The training step's transfers belong to the ops and the
// communication backends, on streams.
#include <cstddef>

#include "loom/core/allocator.hpp"
#include "loom/core/dtype.hpp"

namespace loom::device_memory {

// Whether this build of loom can place tensors on `device`.
bool built_with(Device device);
// CUDA devices this process can see (0 without CUDA, a driver or a GPU).
int cuda_device_count();
// The lowest compute capability of the visible GPUs as 10 major + minor (89: Ada, 90: Hopper);
// 0 without one or without CUDA.
int cuda_min_compute_capability();
// The CUDA device this process computes on: local_rank % the visible devices, so the ranks of a
// node spread over its GPUs (or share one). Call before the first CUDA tensor. Returns the
// device index, or -1 without a visible device (allocation then says why).
int select_cuda_device(int local_rank);
void* allocate(Device device, size_t bytes, MemCategory category);
void release(Device device, void* ptr, size_t bytes, MemCategory category);
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void fill_zero(void* dst, Device device, size_t bytes);
// Waits until every operation queued on `device` so far has finished (nothing to wait for on
// the CPU): what a host clock must wait for before it reads the time of device work.
void synchronize(Device device);
// Waits for the calling thread's current stream alone (core/cuda/stream; not the communication
// streams): the compute queued so far.
void synchronize_stream(Device device);
// This device's live and peak bytes per category.
MemStats stats(Device device);
// Peaks back to the live bytes (a training step measures its own peak).
void reset_peaks(Device device);

}  // namespace loom::device_memory
