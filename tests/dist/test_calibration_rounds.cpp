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

// Op A's loops sleep `round_ms` in turn on the last rank and 1 ms on the others (its warm-up and
// probe 1 ms everywhere); op B does nothing. Returns A's and B's seconds and the order of calls.
struct RoundsResult {
  double a = 0, b = 0;
  std::string order;
};
RoundsResult run_rounds(const std::vector<int>& round_ms) {
  const auto group = world();
  plan::CalibrationOptions options;
  options.repeats = static_cast<int>(round_ms.size());
  options.min_loop_seconds = 1e-9;  // one call per loop
  plan::calibration::ComputeRounds rounds(*group, options);
  const bool last = group->rank() == group->size() - 1;
  std::vector<int> a_ms = {1, 1};
  for (const int ms : round_ms) a_ms.push_back(last ? ms : 1);
  RoundsResult out;
  size_t a_calls = 0;
  const size_t a = rounds.add([&] {
    out.order += 'A';
    std::this_thread::sleep_for(std::chrono::milliseconds(a_ms.at(a_calls++)));
  });
  const size_t b = rounds.add([&] { out.order += 'B'; });
  rounds.run();
  out.a = rounds.seconds(a), out.b = rounds.seconds(b);
  return out;
}

TEST(CalibrationRounds, RoundsInterleaveTheOpsAndKeepEachOpsMedianLoop) {
  // Rounds of 10, 200 and 20 ms on the last rank: the median loop is the 20 ms one (the best
  // would be 10 ms, the mean 77); the slowest rank sets every loop. A sleep lasts at least its
  // time, so only the upper bound allows for the machine.
  const RoundsResult odd = run_rounds({10, 200, 20});
  // Warm-up and probe per op, then the rounds: A B, A B, A B.
  EXPECT_EQ(odd.order, "AABBABABAB");
  EXPECT_GE(odd.a, 0.020);
  EXPECT_LT(odd.a, 0.060);
  EXPECT_LT(odd.b, 0.010);
  // Four rounds of 10, 200, 20 and 30 ms: the mean of the middle two, 25 ms (the lower of them
  // alone, 20, fails).
  const RoundsResult even = run_rounds({10, 200, 20, 30});
  EXPECT_GE(even.a, 0.025);
  EXPECT_LT(even.a, 0.060);
}

}  // namespace
}  // namespace loom::test
