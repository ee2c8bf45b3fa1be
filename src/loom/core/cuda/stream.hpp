#pragma once
// CUDA streams as the engine uses them: every kernel wrapper, cuBLASLt call and copy runs on
// the calling thread's current stream unless given another. That stream is the legacy default
// stream (0) until a StreamGuard names another, so code that never sets one behaves exactly as
// before streams existed. Work on two streams overlaps (DualPipeV's forward of one micro-batch
// under another's backward, communication under compute); Event orders them where one reads
// what the other wrote, and the caching allocator keeps each block to the stream it was
// allocated on (core/cuda/device_allocator.hpp) unless record_stream says another uses it.
#include <cuda_runtime.h>

namespace loom::cuda {

// The calling thread's current stream (0, the legacy default stream, until a StreamGuard).
cudaStream_t current_stream();

// Makes `stream` the calling thread's current stream for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};

// A stream of the current device, created non-blocking (it does not synchronise with the
// legacy default stream, so its work can overlap work there) and destroyed with the object,
// once its work is done. The allocator's cache and cuBLASLt's workspace for a stream stay
// with its handle (which the driver may give to a later stream): make few streams, and keep
// them (OverlapStreams makes two per pipeline executor).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  // Blocks the host until the stream's queued work is done.
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// A point in one stream's work that another stream (or the host) can wait for. Timing is off
// (cudaEventDisableTiming), the cheapest kind for ordering.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Marks the work queued on `stream` so far.
  void record(cudaStream_t stream = current_stream());
  // Later work on `stream` waits until the recorded work is done (the host does not wait).
  void block(cudaStream_t stream = current_stream()) const;
  // Whether the recorded work is done (true when nothing was recorded).
  bool query() const;
  void synchronize() const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// `consumer` waits for the work queued on `producer` so far: record then block, on a
// short-lived event.
void stream_wait(cudaStream_t consumer, cudaStream_t producer);
// Whether the work recorded by `event` is done (cudaEventQuery, its "not ready" not left as
// the thread's last error).
bool event_done(cudaEvent_t event);

}  // namespace loom::cuda
