#include "loom/core/stream_block_pool.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom {

StreamBlockPool::StreamBlockPool(Events events) : events_(std::move(events)) {
  LOOM_CHECK(events_.record && events_.done && events_.wait && events_.destroy,
             "StreamBlockPool needs every event callback");
}

StreamBlockPool::~StreamBlockPool() {
  for (const Waiting& w : waiting_)
    for (EventId e : w.events) events_.destroy(e);
}

void StreamBlockPool::collect_finished() {
  auto finished = [&](Waiting& w) {
    for (EventId e : w.events)
      if (!events_.done(e)) return false;
    for (EventId e : w.events) events_.destroy(e);
    cached_[{w.stream, w.size_class}].push_back(w.ptr);
    return true;
  };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), finished), waiting_.end());
}

void* StreamBlockPool::take(size_t size_class, StreamId stream) {
  if (!waiting_.empty()) collect_finished();
  auto it = cached_.find({stream, size_class});
  if (it == cached_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= static_cast<int64_t>(size_class);
  return ptr;
}

void StreamBlockPool::add_live(void* ptr, size_t size_class, StreamId stream) {
  LOOM_CHECK(ptr != nullptr, "StreamBlockPool: a null block");
  const bool added = live_.emplace(ptr, Live{size_class, stream, {}}).second;
  LOOM_CHECK(added, "StreamBlockPool: block added twice");
}

void StreamBlockPool::record_stream(void* ptr, StreamId stream) {
  auto it = live_.find(ptr);
  LOOM_CHECK(it != live_.end(), "record_stream of a pointer the allocator does not hold live");
  Live& block = it->second;
  if (stream == block.stream ||
      std::find(block.also.begin(), block.also.end(), stream) != block.also.end())
    return;
  block.also.push_back(stream);
}

size_t StreamBlockPool::release(void* ptr) {
  auto it = live_.find(ptr);
  LOOM_CHECK(it != live_.end(), "release of a pointer this allocator does not hold");
  const Live& block = it->second;
  // The events first: if recording one throws, the block stays live and nothing is counted.
  Waiting w{ptr, block.size_class, block.stream, {}};
  try {
    for (StreamId s : block.also) w.events.push_back(events_.record(s));
  } catch (...) {
    for (EventId e : w.events) events_.destroy(e);
    throw;
  }
  const size_t size_class = block.size_class;
  live_.erase(it);
  cached_bytes_ += static_cast<int64_t>(size_class);
  if (w.events.empty())
    cached_[{w.stream, size_class}].push_back(ptr);
  else
    waiting_.push_back(std::move(w));
  return size_class;
}

std::vector<std::pair<void*, size_t>> StreamBlockPool::drain() {
  for (Waiting& w : waiting_)
    for (EventId e : w.events) events_.wait(e);
  collect_finished();
  std::vector<std::pair<void*, size_t>> blocks;
  for (auto& [key, pointers] : cached_)
    for (void* ptr : pointers) blocks.emplace_back(ptr, key.second);
  cached_.clear();
  cached_bytes_ = 0;
  return blocks;
}

size_t StreamBlockPool::size_class_of(void* ptr) const {
  auto it = live_.find(ptr);
  LOOM_CHECK(it != live_.end(), "a pointer this allocator does not hold live");
  return it->second.size_class;
}

}  // namespace loom
