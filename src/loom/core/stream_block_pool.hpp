#pragma once
// The bookkeeping of a caching device allocator with several streams, kept free of CUDA so the
// CPU tests can drive it with stand-in events (core/cuda/device_allocator uses it with
// cudaEvent_t).
//
// A device allocator may hand a released block out again before the kernels that used it have
// run: the next user queues its work behind them. That holds only on the same stream. So every
// block belongs to the stream it was allocated on and is cached for that stream alone; a block
// that other streams also used (record_stream, as PyTorch's caching allocator has it) is cached
// only after an event recorded on each of them at release has completed.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom {

class StreamBlockPool {
 public:
  using StreamId = std::uintptr_t;  // a cudaStream_t's bits (0: the legacy default stream)
  using EventId = std::uintptr_t;
  // How the pool marks and asks about the work queued on a stream.
  struct Events {
    std::function<EventId(StreamId)> record;  // a new event after the stream's queued work
    std::function<bool(EventId)> done;        // whether that work has completed
    std::function<void(EventId)> wait;        // blocks the host until it has
    std::function<void(EventId)> destroy;
  };

  explicit StreamBlockPool(Events events);
  ~StreamBlockPool();
  StreamBlockPool(const StreamBlockPool&) = delete;
  StreamBlockPool& operator=(const StreamBlockPool&) = delete;

  // A cached block of `size_class` bytes that `stream` may use at once (it is taken out of
  // the cache), or nullptr. Blocks whose other streams have finished are cached first.
  void* take(size_t size_class, StreamId stream);
  // `ptr` (of `size_class` bytes, new or taken) is now live, owned by `stream`.
  void add_live(void* ptr, size_t size_class, StreamId stream);
  // Work on `stream` uses the live block `ptr` too; `stream` must outlive the block's release.
  // Throws on a pointer that is not live.
  void record_stream(void* ptr, StreamId stream);
  // The live block `ptr` is released: cached for its stream now, or once the other streams'
  // work queued so far has completed. Returns its size class; throws on a pointer that is not
  // live, and if recording an event throws (the block then stays live, nothing counted).
  size_t release(void* ptr);
  // Every cached block, removed from the pool, after waiting for the streams that still use
  // blocks released here: what the device allocator then gives back to the driver.
  std::vector<std::pair<void*, size_t>> drain();

  bool is_live(void* ptr) const { return live_.count(ptr) != 0; }
  size_t size_class_of(void* ptr) const;
  // Bytes released and not live: cached, and waiting for other streams.
  int64_t cached_bytes() const { return cached_bytes_; }
  int64_t waiting_blocks() const { return static_cast<int64_t>(waiting_.size()); }

 private:
  struct Live {
    size_t size_class;
    StreamId stream;
    std::vector<StreamId> also;  // other streams that use it
  };
  struct Waiting {
    void* ptr;
    size_t size_class;
    StreamId stream;
    std::vector<EventId> events;
  };
  void collect_finished();

  Events events_;
  std::map<std::pair<StreamId, size_t>, std::vector<void*>> cached_;
  std::unordered_map<void*, Live> live_;
  std::vector<Waiting> waiting_;
  int64_t cached_bytes_ = 0;
};

}  // namespace loom
