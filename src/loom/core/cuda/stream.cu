#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/device_memory.hpp"
#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

namespace {
thread_local cudaStream_t t_current = nullptr;  // the legacy default stream
}  // namespace

cudaStream_t current_stream() { return t_current; }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(t_current) { t_current = stream; }
StreamGuard::~StreamGuard() { t_current = previous_; }

Stream::Stream() : stream_(static_cast<cudaStream_t>(side_stream_create())) {}
Stream::~Stream() {
  if (stream_) side_stream_destroy(stream_);
}
void Stream::synchronize() const { LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event() { LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}
void Event::record(cudaStream_t stream) { LOOM_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::block(cudaStream_t stream) const {
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}
bool Event::query() const { return event_done(event_); }

bool event_done(cudaEvent_t event) {
  const cudaError_t rc = cudaEventQuery(event);
  if (rc == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not sticky; clear it so later checks do not see it
    return false;
  }
  LOOM_CUDA_CHECK(rc);
  return true;
}
void Event::synchronize() const { LOOM_CUDA_CHECK(cudaEventSynchronize(event_)); }

void stream_wait(cudaStream_t consumer, cudaStream_t producer) {
  if (consumer == producer) return;
  Event event;
  event.record(producer);
  event.block(consumer);
  // Destroying an event with work still waiting on it is allowed: the wait keeps its place.
}

void* side_stream_create() {
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}
// A destroyed stream's handle may be given to the next stream created, which then inherits
// the blocks the allocator cached for it and its cuBLASLt workspace: both are safe to hand on
// only once its work is done, so the end waits for it.
void side_stream_destroy(void* stream) {
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}
void* exchange_current_stream(void* stream) {
  cudaStream_t previous = t_current;
  t_current = static_cast<cudaStream_t>(stream);
  return previous;
}
void stream_wait_stream(void* consumer, void* producer) {
  stream_wait(static_cast<cudaStream_t>(consumer), static_cast<cudaStream_t>(producer));
}

}  // namespace loom::cuda
