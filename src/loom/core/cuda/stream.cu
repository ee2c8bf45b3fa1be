#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/cuda/stream.hpp"

namespace loom::cuda {

namespace {
thread_local cudaStream_t t_current = nullptr;  // the legacy default stream
}  // namespace

cudaStream_t current_stream() { return t_current; }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(t_current) { t_current = stream; }
StreamGuard::~StreamGuard() { t_current = previous_; }

Stream::Stream() { LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (stream_) (void)cudaStreamDestroy(stream_);  // queued work still completes
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
bool Event::query() const {
  const cudaError_t rc = cudaEventQuery(event_);
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

}  // namespace loom::cuda
