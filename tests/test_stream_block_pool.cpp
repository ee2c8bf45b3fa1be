// The stream rules of the caching device allocator (core/stream_block_pool), driven on the CPU
// with stand-in events that complete when the test says: a released block is cached for the
// stream it was allocated on alone, and a block other streams used (record_stream) is cached
// only once their work queued before the release has completed.
#include <gtest/gtest.h>

#include <set>

#include "loom/core/error.hpp"
#include "loom/core/stream_block_pool.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

// Events numbered in the order recorded, each remembering its stream; `finish(stream)`
// completes every event recorded on it so far.
struct FakeEvents {
  std::vector<StreamBlockPool::StreamId> stream_of{0};  // id 0 unused
  std::set<StreamBlockPool::EventId> finished, destroyed, waited;

  StreamBlockPool::Events callbacks() {
    StreamBlockPool::Events e;
    e.record = [this](StreamBlockPool::StreamId s) {
      stream_of.push_back(s);
      return static_cast<StreamBlockPool::EventId>(stream_of.size() - 1);
    };
    e.done = [this](StreamBlockPool::EventId id) { return finished.count(id) != 0; };
    e.wait = [this](StreamBlockPool::EventId id) {
      waited.insert(id);
      finished.insert(id);
    };
    e.destroy = [this](StreamBlockPool::EventId id) {
      EXPECT_EQ(destroyed.count(id), 0u) << "event " << id << " destroyed twice";
      destroyed.insert(id);
    };
    return e;
  }
  void finish(StreamBlockPool::StreamId s) {
    for (size_t id = 1; id < stream_of.size(); ++id)
      if (stream_of[id] == s) finished.insert(id);
  }
};

constexpr StreamBlockPool::StreamId kA = 0x10, kB = 0x20;

TEST(StreamBlockPool, AReleasedBlockIsCachedForItsOwnStreamOnly) {
  FakeEvents events;
  StreamBlockPool pool(events.callbacks());
  int storage[2];
  void* block = &storage[0];
  pool.add_live(block, 512, kA);
  EXPECT_EQ(pool.release(block), 512u);
  EXPECT_EQ(pool.cached_bytes(), 512);
  EXPECT_EQ(pool.take(512, kB), nullptr) << "another stream would not queue behind A's kernels";
  EXPECT_EQ(pool.take(1024, kA), nullptr) << "another size class";
  EXPECT_EQ(pool.take(512, kA), block);
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(events.stream_of.size(), 1u) << "no event for a block one stream used";
}

TEST(StreamBlockPool, ABlockAnotherStreamUsedWaitsForThatStreamsWork) {
  FakeEvents events;
  StreamBlockPool pool(events.callbacks());
  int storage;
  void* block = &storage;
  pool.add_live(block, 2 << 20, kA);
  pool.record_stream(block, kB);
  pool.record_stream(block, kB);  // once is enough
  pool.record_stream(block, kA);  // its own stream: nothing to wait for
  pool.release(block);
  ASSERT_EQ(events.stream_of.size(), 2u) << "one event, on B";
  EXPECT_EQ(events.stream_of[1], kB);
  EXPECT_EQ(pool.waiting_blocks(), 1);
  EXPECT_EQ(pool.cached_bytes(), 2 << 20) << "released, so no longer live";
  EXPECT_EQ(pool.take(2 << 20, kA), nullptr) << "B may still be reading it";
  events.finish(kA);
  EXPECT_EQ(pool.take(2 << 20, kA), nullptr) << "A's own work does not free B's use";
  events.finish(kB);
  EXPECT_EQ(pool.take(2 << 20, kA), block);
  EXPECT_EQ(pool.waiting_blocks(), 0);
  EXPECT_EQ(events.destroyed.count(1), 1u);
  EXPECT_TRUE(events.waited.empty()) << "the host never waited";
}

TEST(StreamBlockPool, EveryOtherStreamMustFinish) {
  FakeEvents events;
  StreamBlockPool pool(events.callbacks());
  constexpr StreamBlockPool::StreamId kC = 0x30;
  int storage;
  pool.add_live(&storage, 512, kA);
  pool.record_stream(&storage, kB);
  pool.record_stream(&storage, kC);
  pool.release(&storage);
  events.finish(kB);
  EXPECT_EQ(pool.take(512, kA), nullptr);
  events.finish(kC);
  EXPECT_EQ(pool.take(512, kA), &storage);
}

TEST(StreamBlockPool, DrainWaitsForOtherStreamsAndEmptiesTheCache) {
  FakeEvents events;
  StreamBlockPool pool(events.callbacks());
  int a, b, c;
  pool.add_live(&a, 512, kA);
  pool.add_live(&b, 1024, kB);
  pool.add_live(&c, 512, kA);
  pool.record_stream(&b, kA);
  pool.release(&a);
  pool.release(&b);
  const auto blocks = pool.drain();
  EXPECT_EQ(blocks.size(), 2u) << "the live block stays";
  EXPECT_EQ(events.waited.size(), 1u) << "the host waited for A's use of b";
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.waiting_blocks(), 0);
  EXPECT_TRUE(pool.is_live(&c));
  EXPECT_EQ(pool.take(512, kA), nullptr);
}

TEST(StreamBlockPool, ForeignPointersAreRefusedByName) {
  FakeEvents events;
  StreamBlockPool pool(events.callbacks());
  int a;
  expect_contains(error_message([&] { pool.release(&a); }), {"does not hold"});
  EXPECT_THROW(pool.record_stream(&a, kB), Error);
  pool.add_live(&a, 512, kA);
  EXPECT_THROW(pool.add_live(&a, 512, kA), Error);
  pool.release(&a);
  EXPECT_THROW(pool.release(&a), Error) << "released twice";
}

// A release whose event cannot be recorded leaves the block live and uncounted, and destroys
// the events it had made.
TEST(StreamBlockPool, AFailedReleaseLosesNothing) {
  FakeEvents events;
  StreamBlockPool::Events callbacks = events.callbacks();
  const auto record = callbacks.record;
  callbacks.record = [&](StreamBlockPool::StreamId s) -> StreamBlockPool::EventId {
    if (s == 0x30) throw Error("stream 0x30 is gone");
    return record(s);
  };
  StreamBlockPool pool(callbacks);
  int a;
  pool.add_live(&a, 512, kA);
  pool.record_stream(&a, kB);
  pool.record_stream(&a, 0x30);
  EXPECT_THROW(pool.release(&a), Error);
  EXPECT_TRUE(pool.is_live(&a));
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_EQ(pool.waiting_blocks(), 0);
  EXPECT_EQ(events.destroyed.size(), 1u) << "B's event, recorded before the failure";
}

TEST(StreamBlockPool, WaitingEventsAreDestroyedWithThePool) {
  FakeEvents events;
  {
    StreamBlockPool pool(events.callbacks());
    int a;
    pool.add_live(&a, 512, kA);
    pool.record_stream(&a, kB);
    pool.release(&a);
  }
  EXPECT_EQ(events.destroyed.size(), 1u);
}

}  // namespace
}  // namespace loom::test
