// Bad steps across ranks: every rank takes the same decision. A NaN gradient on the last rank
// leaves every rank's state where the previous step left it; a loss spike only the last rank
// sees (under pp only the last stage holds the loss) is skipped everywhere, and two in a row
// roll every rank back to the checkpoint and on to the weights of a run whose data lacked the
// skipped batches, bit for bit. Layouts: dp2 (ZeRO 0-3), pp2, tp2, dp2 x pp2.
#include <gtest/gtest.h>

#include "../bad_steps_fixture.hpp"
#include "dist_fixture.hpp"

namespace loom::test {
namespace {

struct Case {
  std::string name;
  std::vector<std::string> layout;  // train.batch_size is per replica: 4 rows per loader batch
  int ranks;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// This rank's values, moments and masters, as it owns them (ZeRO: its shards).
std::vector<std::vector<float>> owned_state_of(Trainer& trainer) {
  std::vector<std::vector<float>> out;
  for (const OwnedSlice& s : trainer.optimizer().owned_slices()) {
    out.push_back(s.value.to_f32_vector());
    out.push_back(s.exp_avg.to_f32_vector());
    out.push_back(s.exp_avg_sq.to_f32_vector());
    if (s.master.defined()) out.push_back(s.master.to_f32_vector());
  }
  return out;
}

class BadStepsOnRanks : public ::testing::TestWithParam<Case> {};

TEST_P(BadStepsOnRanks, EveryRankSkipsAndRollsBackTogether) {
  const auto world_group = world();
  const Case c = GetParam();
  if (world_group->size() != c.ranks) GTEST_SKIP() << "layout is for " << c.ranks << " ranks";
  const int rank = world_group->rank();
  TinyRun run("bad_steps_" + c.name);
  constexpr int64_t kBatchTokens = 4 * 16;  // rows per loader batch x train.seq_len
  write_batch_shards(run.dir + "/all", 30, kBatchTokens, 64);
  write_batch_shards(run.dir + "/omitted", 30, kBatchTokens, 64, batch_range(6, 6));
  const std::string root = shared_path("bad_steps_" + c.name);
  const std::string base = run.config("gpt2", 10);
  const std::string all = "data.train=\"" + run.dir + "/all/*.bin\"";
  std::vector<std::string> shared = {"data.val=\"\"", "data.shuffle=false", "checkpoint.every=3",
                                     "checkpoint.keep_last=10", "parallel.bucket_mb=0.002"};
  shared.insert(shared.end(), c.layout.begin(), c.layout.end());
  auto with = [&](std::vector<std::string> extra) {
    return parse(base, plus(std::move(extra), shared));
  };

  // A NaN gradient at step 4 on the last rank: every rank's state after step 4 is its state
  // after step 3.
  TrainConfig three = with({all, "checkpoint.dir=\"\"", "log.dir=\"" + run.dir + "/three\""});
  three.steps = 3;
  Trainer before(three, world_group);
  before.run();
  TrainConfig four = with({all, "checkpoint.dir=\"\"", "debug.inject_nan_at_steps=[4]",
                           "log.dir=\"" + run.dir + "/four\""});
  four.steps = 4;
  Trainer at(four, world_group);
  EXPECT_EQ(at.run().skipped_steps, 1);
  EXPECT_EQ(owned_state_of(at), owned_state_of(before)) << "rank " << rank;
  EXPECT_EQ(at.optimizer().steps_taken(), 3);

  // Spikes at steps 5 and 6 in the last rank's view only: skipped on every rank, then the
  // rollback to step 3 with loader batches 6-11 skipped.
  const std::vector<std::string> guard = {
      "bad_steps.loss_spike_factor=3", "bad_steps.median_window=2", "bad_steps.rollback_after=2"};
  Trainer spiky(
      with(plus({all, "debug.inject_loss_spike_at_steps=[5, 6]",
                 "checkpoint.dir=\"" + root + "/spiky\"", "log.dir=\"" + run.dir + "/spiky\""},
                guard)),
      world_group);
  const TrainSummary s = spiky.run();
  Trainer reference(
      with(plus({"data.train=\"" + run.dir + "/omitted/*.bin\"",
                 "checkpoint.dir=\"" + root + "/ref\"", "log.dir=\"" + run.dir + "/ref\""},
                guard)),
      world_group);
  const TrainSummary r = reference.run();
  EXPECT_EQ(s.rollbacks, 1) << "rank " << rank;
  EXPECT_EQ(s.skipped_steps, 2) << "rank " << rank;
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_EQ(spiky.optimizer().steps_taken(), 10);
  EXPECT_EQ(owned_state_of(spiky), owned_state_of(reference)) << "rank " << rank;  // bitwise
  if (rank == 0) {
    // Rank 0 never saw the spike itself: its record names the rank that did.
    int skipped = 0;
    for (const auto& rec : MetricsLog::read_all(run.dir + "/spiky/metrics.jsonl"))
      if (rec.value("skipped", false)) {
        ++skipped;
        EXPECT_NE(rec["bad_step"].get<std::string>().find("loss spike on rank " +
                                                          std::to_string(c.ranks - 1)),
                  std::string::npos)
            << rec;
      }
    EXPECT_EQ(skipped, 2);
  }
  world_group->barrier();
  if (rank == 0) std::filesystem::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, BadStepsOnRanks,
    ::testing::Values(
        Case{"dp2", {"train.batch_size=2"}, 2},
        Case{"dp2_zero1", {"train.batch_size=2", "parallel.zero_stage=1"}, 2},
        Case{"dp2_zero2", {"train.batch_size=2", "parallel.zero_stage=2"}, 2},
        Case{"dp2_zero3", {"train.batch_size=2", "parallel.zero_stage=3"}, 2},
        Case{"pp2", {"parallel.pp=2"}, 2}, Case{"tp2", {"parallel.tp=2"}, 2},
        Case{"dp2_pp2_zero1", {"train.batch_size=2", "parallel.pp=2", "parallel.zero_stage=1"}, 4}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace loom::test
