#pragma once
// Two side streams for work that may overlap on a GPU (DualPipeV's forward of one micro-batch
// beside another's backward), as one device-neutral object: on the CPU every call does nothing
// and the work runs in the order issued.
//
// On CUDA (core/cuda/stream): fork() makes both side streams wait for the work queued so far
// on the default stream, use(i) makes side stream i the calling thread's current stream, so
// every kernel, copy and allocation in its scope goes there, and join() makes the default
// stream wait for both. The caching allocator keeps each side stream's blocks to it, so work
// in one scope never reuses memory the other may still read.
#include <memory>

#include "loom/core/dtype.hpp"

namespace loom {

class OverlapStreams {
 public:
  explicit OverlapStreams(Device device);
  ~OverlapStreams();
  OverlapStreams(const OverlapStreams&) = delete;
  OverlapStreams& operator=(const OverlapStreams&) = delete;

  // The calling thread's current stream is side stream `which` (0 or 1) while this lives.
  class Use {
   public:
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    Use(Use&& other) noexcept;
    Use& operator=(Use&&) = delete;

   private:
    friend class OverlapStreams;
    explicit Use(void* previous, bool active) : previous_(previous), active_(active) {}
    void* previous_;
    bool active_;
  };

  void fork();
  [[nodiscard]] Use use(int which);
  void join();

 private:
  Device device_;
  void* streams_[2] = {nullptr, nullptr};  // cudaStream_t
};

}  // namespace loom
