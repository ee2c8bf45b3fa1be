#pragma once
// The CUDA half of core/device_memory, compiled only with CUDA (LOOM_HAVE_CUDA). Plain C++
// declarations: core/device_memory.cpp calls them without seeing a CUDA header.
#include <cstddef>

#include "loom/core/allocator.hpp"

namespace loom::cuda {

// Devices visible to this process, asked once (0 when the runtime finds no driver or GPU).
int visible_device_count();
// The lowest compute capability (10 major + minor, e.g. 90) of the visible devices; 0 without one.
int min_compute_capability();
// Makes device local_rank % visible_device_count() this thread's (ranks of one node spread over
// its GPUs, or share the one there is); returns it, or -1 when none is visible.
int select_device(int local_rank);
// Refuses, naming the cause, when no device is visible.
void* device_allocate(size_t bytes, MemCategory category);
void device_release(void* ptr, size_t bytes, MemCategory category);
// kind: 0 host to device, 1 device to host, 2 device to device.
void device_copy(void* dst, const void* src, size_t bytes, int kind);
void device_fill_zero(void* dst, size_t bytes);
// cudaDeviceSynchronize on the current device: every stream's queued work done.
void device_synchronize();
// cudaStreamSynchronize on the calling thread's current stream.
void current_stream_synchronize();
MemStats device_stats();
// Page-locked host memory from a cache (cudaHostAlloc once per block; blocks are reused, never
// given back before exit), so staging copies to and from the device run at full bus speed
// instead of through the driver's own bounce buffers. Only once select_device has chosen a
// device: returns nullptr before that, and on a machine without one.
void* pinned_host_allocate(size_t bytes);
// true when `ptr` came from pinned_host_allocate (it goes back to the cache), else false.
bool pinned_host_release(void* ptr);
void device_reset_peaks();

// Streams as opaque handles (cudaStream_t; nullptr is the legacy default stream), for
// core/overlap_streams: a new non-blocking stream of the current device and its end; the
// calling thread's current stream set to `stream`, returning the one it replaces; and
// `consumer` made to wait for the work queued on `producer` so far.
void* side_stream_create();
void side_stream_destroy(void* stream);
void* exchange_current_stream(void* stream);
void stream_wait_stream(void* consumer, void* producer);

}  // namespace loom::cuda
