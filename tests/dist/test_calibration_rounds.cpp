// `loom calibrate`'s CPU compute timing (plan/calibration_loops.hpp, ComputeRounds): each op is
// warmed up and probed, then timed once per round in turn, and keeps the median of its rounds;
// every rank of the world runs it together and the slowest rank's loop is what counts.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dist_fixture.hpp"
#include "loom/plan/calibration_loops.hpp"

namespace loom::test {
namespace {

TEST(CalibrationRounds, RoundsInterleaveTheOpsAndKeepEachOpsMedianLoop) {
  const auto group = world();
  plan::CalibrationOptions options;
  options.repeats = 3;
  options.min_loop_seconds = 1e-9;  // one call per loop
  plan::calibration::ComputeRounds rounds(*group, options);
  std::string order;
  // Op A sleeps, call by call: the warm-up and the probe 1 ms, then the three rounds 10, 100 and
  // 20 ms on the last rank and 1 ms on the others. The median loop is the 20 ms one (a best loop
  // would be 10 ms, a mean 43 ms); the slowest rank sets every loop.
  const bool last = group->rank() == group->size() - 1;
  const std::vector<int> a_ms = {1, 1, last ? 10 : 1, last ? 100 : 1, last ? 20 : 1};
  size_t a_calls = 0;
  const size_t a = rounds.add([&] {
    order += 'A';
    std::this_thread::sleep_for(std::chrono::milliseconds(a_ms.at(a_calls++)));
  });
  const size_t b = rounds.add([&] { order += 'B'; });
  rounds.run();
  // Warm-up and probe per op, then the rounds: A B, A B, A B.
  EXPECT_EQ(order, "AABBABABAB");
  EXPECT_GE(rounds.seconds(a), 0.020);
  EXPECT_LT(rounds.seconds(a), 0.100);
  EXPECT_LT(rounds.seconds(b), 0.010);
}

}  // namespace
}  // namespace loom::test
