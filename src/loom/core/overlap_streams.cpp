#include "loom/core/overlap_streams.hpp"

#include "loom/core/error.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/core/cuda/device_memory.hpp"
#endif

namespace loom {

OverlapStreams::OverlapStreams(Device device) : device_(device) {
  if (device_ != Device::CUDA) return;
#ifdef LOOM_HAVE_CUDA
  for (void*& stream : streams_) stream = cuda::side_stream_create();
#else
  throw_error("OverlapStreams: this loom was built without CUDA");
#endif
}

OverlapStreams::~OverlapStreams() {
#ifdef LOOM_HAVE_CUDA
  for (void* stream : streams_)
    if (stream) cuda::side_stream_destroy(stream);
#endif
}

void OverlapStreams::fork() {
#ifdef LOOM_HAVE_CUDA
  if (device_ == Device::CUDA)
    for (void* stream : streams_) cuda::stream_wait_stream(stream, nullptr);
#endif
}

void OverlapStreams::join() {
#ifdef LOOM_HAVE_CUDA
  if (device_ == Device::CUDA)
    for (void* stream : streams_) cuda::stream_wait_stream(nullptr, stream);
#endif
}

OverlapStreams::Use OverlapStreams::use(int which) {
  LOOM_CHECK(which == 0 || which == 1, "OverlapStreams::use(", which, "): 0 or 1");
#ifdef LOOM_HAVE_CUDA
  if (device_ == Device::CUDA) return Use(cuda::exchange_current_stream(streams_[which]), true);
#endif
  return Use(nullptr, false);
}

OverlapStreams::Use::Use(Use&& other) noexcept
    : previous_(other.previous_), active_(other.active_) {
  other.active_ = false;
}

OverlapStreams::Use::~Use() {
#ifdef LOOM_HAVE_CUDA
  if (active_) (void)cuda::exchange_current_stream(previous_);
#endif
}

}  // namespace loom
