// DataLoader on tiny shards whose tokens encode their own position (shard s holds
// 100*s, 100*s+1, ...), so every batch shows exactly which window it came from.
#include <algorithm>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/data_loader.hpp"
#include "loom/data/token_shard.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kB = 2;
constexpr int64_t kT = 4;
constexpr int64_t kVocab = 65536;

std::vector<int32_t> iota_tokens(int32_t first, int32_t count) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

struct Batch {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader) {
  Batch batch{std::vector<int32_t>(kB * kT), std::vector<int32_t>(kB * kT)};
  loader.next_batch(batch.inputs.data(), batch.targets.data());
  return batch;
}

// With B*T = 8 (windows of 9): shard 0 (20 tokens) gives windows at 0 and 8 and drops the last
// 4 tokens; shard 1 (10 tokens) gives one window; shard 2 (exactly 9 tokens) gives one window.
class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    paths_ = {dir_.file("toy_train_000000.bin"), dir_.file("toy_train_000001.bin"),
              dir_.file("toy_train_000002.bin")};
    write_token_shard(paths_[0], iota_tokens(0, 20));
    write_token_shard(paths_[1], iota_tokens(100, 10));
    write_token_shard(paths_[2], iota_tokens(200, 9));
  }
  DataLoader make_loader() const { return DataLoader(paths_, kB, kT, kVocab); }

  TempDir dir_{"loom_test_data_loader"};
  std::vector<std::string> paths_;
};

TEST_F(DataLoaderTest, WindowsAreContiguousAndTargetsAreInputsShiftedByOne) {
  DataLoader loader = make_loader();
  EXPECT_EQ(loader.tokens_per_batch(), kB * kT);
  const Batch first = next(loader);
  EXPECT_EQ(first.inputs, iota_tokens(0, 8));   // row 0 = 0..3, row 1 = 4..7
  EXPECT_EQ(first.targets, iota_tokens(1, 8));  // each input's next token
  const Batch second = next(loader);
  EXPECT_EQ(second.inputs, iota_tokens(8, 8));  // the next window starts B*T later
  EXPECT_EQ(second.targets, iota_tokens(9, 8));
}

TEST_F(DataLoaderTest, MovesToNextShardWhenAWindowNoLongerFits) {
  DataLoader loader = make_loader();
  next(loader);
  next(loader);
  EXPECT_EQ(loader.state(), (LoaderState{0, 1, 0}));  // tokens 16..19 of shard 0 are skipped
  const Batch third = next(loader);
  EXPECT_EQ(third.inputs, iota_tokens(100, 8));
  EXPECT_EQ(third.targets, iota_tokens(101, 8));
  const Batch fourth = next(loader);  // a shard of exactly B*T+1 tokens holds one window
  EXPECT_EQ(fourth.inputs, iota_tokens(200, 8));
  EXPECT_EQ(fourth.targets, iota_tokens(201, 8));
}

TEST_F(DataLoaderTest, StartsANewEpochAfterTheLastShard) {
  DataLoader loader = make_loader();
  std::vector<Batch> epoch0;
  for (int i = 0; i < 4; ++i) epoch0.push_back(next(loader));
  EXPECT_EQ(loader.state(), (LoaderState{1, 0, 0}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(next(loader), epoch0[i]) << "batch " << i << " of epoch 1";
  EXPECT_EQ(loader.state(), (LoaderState{2, 0, 0}));
}

TEST_F(DataLoaderTest, IsDeterministicAcrossInstances) {
  DataLoader a = make_loader();
  DataLoader b = make_loader();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(next(a), next(b)) << "batch " << i;
}

TEST_F(DataLoaderTest, RestoreGivesIdenticalSubsequentBatches) {
  for (int batches_before_save = 0; batches_before_save < 9; ++batches_before_save) {
    DataLoader original = make_loader();
    for (int i = 0; i < batches_before_save; ++i) next(original);
    const LoaderState saved = original.state();
    std::vector<Batch> expected;
    for (int i = 0; i < 6; ++i) expected.push_back(next(original));

    DataLoader resumed = make_loader();
    next(resumed);  // a resumed loader may be anywhere before restore()
    resumed.restore(saved);
    EXPECT_EQ(resumed.state(), saved);
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(next(resumed), expected[i])
          << "saved after " << batches_before_save << " batches, batch " << i;
    }
    EXPECT_EQ(resumed.state(), original.state());
  }
}

TEST_F(DataLoaderTest, ShuffleVisitsSequenceSlotsInASeededOrderAndResumesExactly) {
  // A 401-token shard has 100 slots of T=4 (+1 target) and gives 50 batches of B=2 per epoch.
  const std::string path = dir_.file("big_000000.bin");
  write_token_shard(path, iota_tokens(0, 401));
  auto shuffled = [&](uint64_t seed) {
    DataLoader loader({path}, kB, kT, 1000);
    loader.set_shuffle(seed);
    return loader;
  };
  DataLoader loader = shuffled(7);
  std::vector<int32_t> slot_starts;
  for (int i = 0; i < 50; ++i) {
    const Batch batch = next(loader);
    for (int64_t b = 0; b < kB; ++b) {
      const int32_t start = batch.inputs[b * kT];
      EXPECT_EQ(start % kT, 0);  // a whole slot
      for (int64_t t = 0; t < kT; ++t) {
        EXPECT_EQ(batch.inputs[b * kT + t], start + t);
        EXPECT_EQ(batch.targets[b * kT + t], start + t + 1);
      }
      slot_starts.push_back(start);
    }
  }
  EXPECT_EQ(loader.state().epoch, 1);
  std::vector<int32_t> sorted = slot_starts;
  std::sort(sorted.begin(), sorted.end());
  for (int k = 0; k < 100; ++k) EXPECT_EQ(sorted[k], 4 * k);  // every slot exactly once
  EXPECT_NE(sorted, slot_starts);                             // and not in file order

  DataLoader other_seed = shuffled(8);
  DataLoader same_seed = shuffled(7);
  EXPECT_NE(next(other_seed), next(same_seed));
  // The next epoch uses a different permutation; a restored loader continues identically.
  const LoaderState saved = loader.state();
  std::vector<Batch> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(next(loader));
  DataLoader resumed = shuffled(7);
  resumed.restore(saved);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(next(resumed), expected[i]);
}

TEST_F(DataLoaderTest, RestoreRejectsStatesThatDoNotFit) {
  DataLoader loader = make_loader();
  EXPECT_THAT(error_message([&] {
                loader.restore({0, 3, 0});
              }),
              AllOf(HasSubstr("shard index 3"), HasSubstr("[0, 3)")));
  EXPECT_THAT(error_message([&] { loader.restore({-1, 0, 0}); }), HasSubstr("epoch -1"));
  EXPECT_THAT(error_message([&] {
                loader.restore({0, 0, 16});
              }),
              AllOf(HasSubstr("position 16"), HasSubstr(paths_[0]), HasSubstr("20 tokens")));
  EXPECT_THAT(error_message([&] { loader.restore({0, 0, 4}); }), HasSubstr("not a multiple of B*T = 8"));
  EXPECT_THAT(error_message([&] { loader.restore({0, 0, -8}); }), HasSubstr("position -8"));
  EXPECT_EQ(loader.state(), (LoaderState{0, 0, 0}));  // a rejected state changes nothing
}

TEST_F(DataLoaderTest, FromPatternExpandsAGlobInNameOrder) {
  DataLoader loader = DataLoader::from_pattern(dir_.file("toy_train_*.bin"), kB, kT, kVocab);
  EXPECT_EQ(loader.shard_paths(), paths_);
  const std::string pattern = dir_.file("nothing_*.bin");
  EXPECT_THAT(error_message([&] { DataLoader::from_pattern(pattern, kB, kT, kVocab); }),
              AllOf(HasSubstr("no token shards match"), HasSubstr(pattern)));
}

TEST_F(DataLoaderTest, ShardTooSmallForOneBatchIsAnError) {
  const std::string tiny = dir_.file("tiny.bin");
  write_token_shard(tiny, iota_tokens(0, 8));  // B*T+1 = 9 needed
  EXPECT_THAT(error_message([&] {
                DataLoader({paths_[0], tiny}, kB, kT, kVocab);
              }),
              AllOf(HasSubstr(tiny), HasSubstr("holds 8 tokens"), HasSubstr("B*T+1 = 2*4+1 = 9")));
}

TEST_F(DataLoaderTest, BadArgumentsAndVocabularyMismatchAreErrors) {
  EXPECT_THAT(error_message([&] { DataLoader(paths_, 0, kT, kVocab); }), HasSubstr("B=0"));
  EXPECT_THAT(error_message([&] { DataLoader(std::vector<std::string>{}, kB, kT, kVocab); }),
              HasSubstr("no token shards"));
  // Shard 2 holds tokens up to 208; with a vocabulary of 150 the loader fails when it gets there.
  DataLoader loader(paths_, kB, kT, 150);
  next(loader);
  next(loader);
  next(loader);
  EXPECT_THAT(error_message([&] { next(loader); }),
              AllOf(HasSubstr(paths_[2]), HasSubstr("vocabulary mismatch")));
}

// Llama 3 sized ids (uint32 shards) come out of the loader as they went in, in order and
// shuffled, mixed with a uint16 shard.
TEST(DataLoaderWideShards, ReadsUint32ShardsBesideUint16Ones) {
  TempDir dir("loom_test_data_loader");
  const std::vector<std::string> paths = {dir.file("w_000000.bin"), dir.file("w_000001.bin")};
  write_token_shard(paths[0], iota_tokens(128000 - 10, 20), 128256);  // crosses 65535 and 128000
  write_token_shard(paths[1], iota_tokens(100, 9), 65536);
  DataLoader loader(paths, kB, kT, 128256);
  Batch batch = next(loader);
  EXPECT_EQ(batch.inputs, iota_tokens(127990, 8));
  EXPECT_EQ(batch.targets, iota_tokens(127991, 8));
  batch = next(loader);
  EXPECT_EQ(batch.inputs, iota_tokens(127998, 8));
  batch = next(loader);
  EXPECT_EQ(batch.inputs, iota_tokens(100, 8));

  DataLoader shuffled(paths, kB, kT, 128256);
  shuffled.set_shuffle(7);
  std::vector<int32_t> rows;
  for (int step = 0; step < 2; ++step) {
    batch = next(shuffled);
    for (int64_t b = 0; b < kB; ++b) {
      EXPECT_EQ((batch.inputs[b * kT] - 127990) % kT, 0) << "rows start at slot boundaries";
      for (int64_t t = 0; t < kT; ++t) EXPECT_EQ(batch.targets[b * kT + t], batch.inputs[b * kT + t] + 1);
      rows.push_back(batch.inputs[b * kT]);
    }
  }
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<int32_t>{127990, 127994, 127998, 128002}));
  EXPECT_THAT(error_message([&] { DataLoader(paths, kB, kT, 65536).next_batch(batch.inputs.data(), batch.targets.data()); }),
              HasSubstr("vocabulary mismatch"));
}

}  // namespace
}  // namespace loom::test
