// DataLoader on tiny shards whose tokens encode their own position (shard s holds
// 100*s, 100*s+1, ...), so every batch shows exactly which window it came from.
#include <algorithm>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
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

// With T = 4 a shard of n tokens holds (n - 1) / 4 sequence slots: shard 0 (20 tokens) slots at
// 0, 4, 8, 12 (tokens 16..19 can only be targets of the last); shard 1 (10 tokens) at 100, 104;
// shard 2 (exactly 9 tokens) at 200, 204. Eight slots: four batches of B = 2 per epoch.
class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    paths_ = {dir_.file("toy_train_000000.bin"), dir_.file("toy_train_000001.bin"),
              dir_.file("toy_train_000002.bin")};
    write_token_shard(paths_[0], iota_tokens(0, 20));
    write_token_shard(paths_[1], iota_tokens(100, 10));
    write_token_shard(paths_[2], iota_tokens(200, 9));
  }
  DataLoader make_loader(int64_t batch = kB) const { return DataLoader(paths_, batch, kT, kVocab); }

  TempDir dir_{"loom_test_data_loader"};
  std::vector<std::string> paths_;
};

LoaderState one_source(int64_t sequences) { return {sequences, {sequences}}; }

TEST_F(DataLoaderTest, WindowsAreContiguousAndTargetsAreInputsShiftedByOne) {
  DataLoader loader = make_loader();
  EXPECT_EQ(loader.tokens_per_batch(), kB * kT);
  EXPECT_EQ(loader.source_slots(0), 8);
  const Batch first = next(loader);
  EXPECT_EQ(first.inputs, iota_tokens(0, 8));   // row 0 = 0..3, row 1 = 4..7
  EXPECT_EQ(first.targets, iota_tokens(1, 8));  // each input's next token
  const Batch second = next(loader);
  EXPECT_EQ(second.inputs, iota_tokens(8, 8));  // the next window starts B*T later
  EXPECT_EQ(second.targets, iota_tokens(9, 8));
}

TEST_F(DataLoaderTest, MovesToTheNextShardAfterItsLastSlot) {
  DataLoader loader = make_loader();
  next(loader);
  next(loader);
  EXPECT_EQ(loader.state(), one_source(4));  // tokens 16..19 of shard 0 start no sequence
  const Batch third = next(loader);
  EXPECT_EQ(third.inputs, iota_tokens(100, 8));
  EXPECT_EQ(third.targets, iota_tokens(101, 8));
  const Batch fourth = next(loader);  // a shard of exactly B*T+1 tokens holds one batch
  EXPECT_EQ(fourth.inputs, iota_tokens(200, 8));
  EXPECT_EQ(fourth.targets, iota_tokens(201, 8));
}

// A batch may take the last slot of one shard and the first of the next, but a sequence never
// spans two shards (a document's end is never glued to another file's start).
TEST_F(DataLoaderTest, ABatchSpansShardsButASequenceNever) {
  DataLoader loader(paths_, 3, kT, kVocab);  // B = 3: slots 0,4,8 | 12,100,104 | 200,204,0
  std::vector<int32_t> inputs(3 * kT), targets(3 * kT);
  loader.next_batch(inputs.data(), targets.data());
  loader.next_batch(inputs.data(), targets.data());
  const std::vector<int32_t> expected = {12, 13, 14, 15, 100, 101, 102, 103, 104, 105, 106, 107};
  EXPECT_EQ(inputs, expected);
  EXPECT_EQ(targets[3], 16);   // shard 0's last token, as a target only
  EXPECT_EQ(targets[7], 104);  // shard 1's, not shard 0's 17
  loader.next_batch(inputs.data(), targets.data());
  EXPECT_EQ(inputs, (std::vector<int32_t>{200, 201, 202, 203, 204, 205, 206, 207, 0, 1, 2, 3}));
}

TEST_F(DataLoaderTest, StartsANewEpochAfterTheLastShard) {
  DataLoader loader = make_loader();
  std::vector<Batch> epoch0;
  for (int i = 0; i < 4; ++i) epoch0.push_back(next(loader));
  EXPECT_EQ(loader.state(), one_source(8));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(next(loader), epoch0[i]) << "batch " << i << " of epoch 1";
  EXPECT_EQ(loader.state(), one_source(16));
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

// The position is in sequences: a run at dp 4 (a loader batch of 4 x B rows) saved after three
// steps and resumed at dp 2 with twice the accumulation (batches of 2 x B rows) reads on with
// exactly the sequences the dp 4 run would have read, shuffled, from two mixed sources.
TEST_F(DataLoaderTest, ResumeWithAnotherBatchSplitReadsTheSameSequences) {
  const std::string other = dir_.file("other_000000.bin");
  write_token_shard(other, iota_tokens(1000, 41));  // 10 slots
  auto make = [&](int64_t rows) {
    DataLoader loader({paths_, {other}}, {2.0, 1.0}, {"a", "b"}, rows, kT, kVocab);
    loader.set_shuffle(11);
    return loader;
  };
  const int64_t global_rows = 8;  // per optimizer step
  DataLoader dp4 = make(global_rows);
  std::vector<int32_t> in(global_rows * kT), tg(global_rows * kT);
  for (int step = 0; step < 3; ++step) dp4.next_batch(in.data(), tg.data());
  const LoaderState saved = dp4.state();
  EXPECT_EQ(saved.sequences, 24);
  std::vector<std::vector<int32_t>> expected;
  for (int step = 0; step < 4; ++step) {
    dp4.next_batch(in.data(), tg.data());
    expected.push_back(in);
  }
  DataLoader dp2 = make(global_rows / 2);
  dp2.restore(saved);
  for (int step = 0; step < 4; ++step) {
    std::vector<int32_t> rows(global_rows * kT), targets(global_rows * kT);
    dp2.next_batch(rows.data(), targets.data());                       // micro-batch 1
    dp2.next_batch(rows.data() + global_rows / 2 * kT, targets.data() + global_rows / 2 * kT);  // 2
    EXPECT_EQ(rows, expected[static_cast<size_t>(step)]) << "step " << step + 4;
  }
}

TEST(DataLoaderShuffle, PermuteIndexIsABijectionThatMoves) {
  for (int64_t size = 1; size <= 300; ++size) {
    std::vector<int64_t> seen(static_cast<size_t>(size), 0);
    for (int64_t i = 0; i < size; ++i) ++seen[static_cast<size_t>(permute_index(i, size, 42))];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), size) << "size " << size;
  }
  int64_t fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += permute_index(i, 1000, 42) == i;
  EXPECT_LT(fixed, 10);  // a random permutation fixes one point on average
  int64_t same = 0;
  for (int64_t i = 0; i < 1000; ++i) same += permute_index(i, 1000, 42) == permute_index(i, 1000, 43);
  EXPECT_LT(same, 10);  // another key, another permutation
  const int64_t huge = int64_t{3} << 40;  // 3.3e12 slots: no table, O(1) memory
  EXPECT_LT(permute_index(huge - 1, huge, 42), huge);
}

TEST_F(DataLoaderTest, ShuffleVisitsEverySlotOfEveryShardOncePerEpochAcrossShards) {
  // Three shards of 101 tokens: 25 slots each, 75 in all; B = 3 gives 25 batches an epoch.
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) {
    paths.push_back(dir_.file("big_00000" + std::to_string(s) + ".bin"));
    write_token_shard(paths.back(), iota_tokens(1000 * s, 101));
  }
  auto shuffled = [&](uint64_t seed) {
    DataLoader loader(paths, 3, kT, 4000);
    loader.set_shuffle(seed);
    return loader;
  };
  DataLoader loader = shuffled(7);
  std::vector<int32_t> in(3 * kT), tg(3 * kT);
  std::vector<std::vector<int32_t>> epochs(2);
  for (auto& starts : epochs) {
    for (int i = 0; i < 25; ++i) {
      loader.next_batch(in.data(), tg.data());
      for (int64_t b = 0; b < 3; ++b) {
        const int32_t start = in[b * kT];
        EXPECT_EQ(start % 1000 % kT, 0);  // a whole slot
        for (int64_t t = 0; t < kT; ++t) {
          EXPECT_EQ(in[b * kT + t], start + t);
          EXPECT_EQ(tg[b * kT + t], start + t + 1);
        }
        starts.push_back(start);
      }
    }
  }
  EXPECT_EQ(loader.state(), one_source(150));
  std::vector<int32_t> all_slots;
  for (int s = 0; s < 3; ++s)
    for (int k = 0; k < 25; ++k) all_slots.push_back(1000 * s + 4 * k);
  for (const auto& starts : epochs) {
    std::vector<int32_t> sorted = starts;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all_slots);  // every slot of every shard exactly once
    // Across shards: the first 12 sequences come from more than one shard.
    std::vector<int32_t> shards;
    for (int i = 0; i < 12; ++i) shards.push_back(starts[static_cast<size_t>(i)] / 1000);
    EXPECT_GT(std::set<int32_t>(shards.begin(), shards.end()).size(), 1u);
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a fresh permutation per epoch
  EXPECT_LE(loader.mapped_shards(), DataLoader::kMaxMappedShards);

  DataLoader other_seed = shuffled(8);
  DataLoader same_seed = shuffled(7);
  std::vector<int32_t> a(3 * kT), b(3 * kT);
  other_seed.next_batch(a.data(), tg.data());
  same_seed.next_batch(b.data(), tg.data());
  EXPECT_NE(a, b);
  EXPECT_EQ((std::vector<int32_t>{b[0], b[kT], b[2 * kT]}),
            std::vector<int32_t>(epochs[0].begin(), epochs[0].begin() + 3));  // same seed, same order
}

// Sources by weight: 3 : 1 takes a, a, b, a, then repeats (by hand: the deficits w (g + 1) - c
// are (.75, .25), (.5, .5) tie to a, (.25, .75), (1, 0)).
TEST_F(DataLoaderTest, MixesSourcesByWeight) {
  const std::string b_path = dir_.file("b_000000.bin");
  write_token_shard(b_path, iota_tokens(5000, 41));
  DataLoader loader({paths_, {b_path}}, {3.0, 1.0}, {"a", "b"}, 1, kT, kVocab);
  std::vector<int32_t> in(kT), tg(kT);
  std::vector<int64_t> order;
  for (int g = 0; g < 12; ++g) {
    int64_t source = -1;
    loader.next_sequence(in.data(), tg.data(), &source);
    order.push_back(source);
    EXPECT_EQ(in[0] >= 5000, source == 1);
  }
  EXPECT_EQ(order, (std::vector<int64_t>{0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(loader.state(), (LoaderState{12, {9, 3}}));
}

// Three sources of very different sizes (they wrap around at different rates) at weights
// 0.5 / 0.3 / 0.2: after any number of sequences each has its share to within two sequences,
// and over 20,000 sequences to within 1% of it.
TEST_F(DataLoaderTest, MixedSharesMatchTheWeightsAtEveryStep) {
  const std::string b_path = dir_.file("b_000000.bin"), c_path = dir_.file("c_000000.bin");
  write_token_shard(b_path, iota_tokens(5000, 401));
  write_token_shard(c_path, iota_tokens(9000, 13));
  DataLoader loader({paths_, {b_path}, {c_path}}, {5.0, 3.0, 2.0}, {"a", "b", "c"}, 1, kT, 20000);
  loader.set_shuffle(3);
  const double weights[3] = {0.5, 0.3, 0.2};
  std::vector<int32_t> in(kT), tg(kT);
  double worst = 0;
  for (int64_t g = 1; g <= 20000; ++g) {
    loader.next_sequence(in.data(), tg.data());
    for (size_t s = 0; s < 3; ++s)
      worst = std::max(worst, std::abs(static_cast<double>(loader.state().source_sequences[s]) -
                                       weights[s] * static_cast<double>(g)));
  }
  EXPECT_LT(worst, 2.0);
  for (size_t s = 0; s < 3; ++s)
    EXPECT_NEAR(static_cast<double>(loader.state().source_sequences[s]) / 20000.0, weights[s], 0.01 * weights[s]);
}

TEST_F(DataLoaderTest, RestoreRejectsStatesThatDoNotFit) {
  DataLoader loader = make_loader();
  EXPECT_THAT(error_message([&] { loader.restore({3, {1, 2}}); }),
              AllOf(HasSubstr("2 data source(s)"), HasSubstr("reads 1")));
  EXPECT_THAT(error_message([&] { loader.restore({-1, {-1}}); }), HasSubstr("-1 sequences read is negative"));
  EXPECT_THAT(error_message([&] { loader.restore({5, {4}}); }), HasSubstr("sum to 4"));
  EXPECT_EQ(loader.state(), one_source(0));  // a rejected state changes nothing
}

TEST_F(DataLoaderTest, FromPatternExpandsAGlobInNameOrder) {
  DataLoader loader = DataLoader::from_pattern(dir_.file("toy_train_*.bin"), kB, kT, kVocab);
  EXPECT_EQ(loader.shard_paths(), paths_);
  const std::string pattern = dir_.file("nothing_*.bin");
  EXPECT_THAT(error_message([&] { DataLoader::from_pattern(pattern, kB, kT, kVocab); }),
              AllOf(HasSubstr("no token shards match"), HasSubstr(pattern)));
  EXPECT_THAT(error_message([&] {
                DataLoader::from_sources({{dir_.file("toy_train_*.bin"), 1.0}, {pattern, 2.0}}, "data.sources", kB,
                                         kT, kVocab);
              }),
              AllOf(HasSubstr("data.sources[1]"), HasSubstr("no token shards match")));
}

TEST_F(DataLoaderTest, ASourceWithoutOneSequenceOrABadWeightIsAnError) {
  const std::string tiny = dir_.file("tiny.bin");
  write_token_shard(tiny, iota_tokens(0, 4));  // T+1 = 5 needed
  EXPECT_THAT(error_message([&] { DataLoader({tiny}, kB, kT, kVocab); }),
              AllOf(HasSubstr(tiny), HasSubstr("holds 4"), HasSubstr("T+1 = 5")));
  DataLoader with_tiny({paths_[0], tiny}, kB, kT, kVocab);  // a short shard among others adds no slot
  EXPECT_EQ(with_tiny.source_slots(0), 4);
  EXPECT_THAT(error_message([&] { DataLoader({paths_, paths_}, {1.0, 0.0}, {"a", "zero"}, kB, kT, kVocab); }),
              AllOf(HasSubstr("zero"), HasSubstr("weight 0")));
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
  for (int step = 0; step < 3; ++step) {  // one epoch: the 6 slots of both shards
    batch = next(shuffled);
    for (int64_t b = 0; b < kB; ++b) {
      for (int64_t t = 0; t < kT; ++t) EXPECT_EQ(batch.targets[b * kT + t], batch.inputs[b * kT + t] + 1);
      rows.push_back(batch.inputs[b * kT]);
    }
  }
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, (std::vector<int32_t>{100, 104, 127990, 127994, 127998, 128002}));
  EXPECT_THAT(error_message([&] { DataLoader(paths, kB, kT, 65536).next_batch(batch.inputs.data(), batch.targets.data()); }),
              HasSubstr("vocabulary mismatch"));
}

}  // namespace
}  // namespace loom::test
