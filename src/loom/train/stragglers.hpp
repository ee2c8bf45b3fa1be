#pragma once
// Stragglers: every log interval the ranks' compute times (forward and backward of their
// micro-batches, summed over the interval) are gathered, and the slowest rank is named when it
// lags the median rank by more than a set fraction (log.straggler_fraction). The compute time
// is what a slow rank shows first: the wall time of a step is the same on every rank, since
// the collectives make the others wait for it.
#include <cstdint>
#include <vector>

namespace loom {

struct RankTimes {
  double min_s = 0, median_s = 0, max_s = 0;
  int slowest_rank = 0;
  double lag = 0;          // max / median - 1
  bool straggler = false;  // lag > the fraction asked for
};

// From each rank's seconds (index = world rank); the median of an even count is the mean of
// the middle two; ties for the slowest go to the lowest rank. `fraction` <= 0: never a straggler.
RankTimes compare_rank_times(const std::vector<double>& seconds, double fraction);

}  // namespace loom
