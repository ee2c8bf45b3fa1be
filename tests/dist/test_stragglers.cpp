// Stragglers: a rank made slow on purpose (debug.slow_rank) is named at every log point in
// rank 0's metrics and log, with its compute time; the others are not.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"

namespace loom::test {
namespace {

TEST(Stragglers, TheSlowRankIsNamedAtEveryLogPoint) {
  const auto world_group = world();
  const int n = world_group->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks or more";
  TinyRun run("stragglers");
  constexpr double kSleepMs = 150;
  Trainer trainer(
      parse(
          run.config("gpt2", 4),
          {"checkpoint.dir=\"\"", "data.val=\"\"", "train.batch_size=" + std::to_string(8 / n),
           "log.every=2", "log.straggler_fraction=0.5", "debug.slow_rank=" + std::to_string(n - 1),
           "debug.slow_rank_ms=" + std::to_string(kSleepMs), "log.dir=\"" + run.dir + "/run\""}),
      world_group);
  trainer.run();
  if (world_group->rank() != 0) return;
  std::vector<int64_t> logged;
  for (const auto& r : MetricsLog::read_all(run.dir + "/run/metrics.jsonl")) {
    if (r["kind"] != "train") continue;
    if (!r.contains("rank_compute_ms")) continue;
    logged.push_back(r["step"].get<int64_t>());
    EXPECT_EQ(r["straggler_rank"], n - 1) << r;
    EXPECT_EQ(r["rank_compute_ms"]["slowest_rank"], n - 1) << r;
    EXPECT_GE(r["rank_compute_ms"]["max"].get<double>(), kSleepMs) << r;
    // The tiny model's own forward and backward take a few ms: the others are far below.
    EXPECT_LT(r["rank_compute_ms"]["min"].get<double>(), kSleepMs) << r;
    EXPECT_GT(r["straggler_lag"].get<double>(), 0.5) << r;
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 4}));
}

TEST(Stragglers, ASlowRankOutsideTheLaunchIsRefused) {
  const auto world_group = world();
  TinyRun run("stragglers_bad");
  try {
    Trainer trainer(
        parse(run.config("gpt2", 4), {"debug.slow_rank=" + std::to_string(world_group->size())}),
        world_group);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("debug.slow_rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::test
