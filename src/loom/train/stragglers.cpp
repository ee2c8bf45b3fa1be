#include "loom/train/stragglers.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom {

RankTimes compare_rank_times(const std::vector<double>& seconds, double fraction) {
  if (seconds.empty()) throw_error("compare_rank_times: no ranks");
  RankTimes out;
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  out.min_s = sorted.front();
  out.max_s = sorted.back();
  out.median_s = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  out.slowest_rank =
      static_cast<int>(std::max_element(seconds.begin(), seconds.end()) - seconds.begin());
  out.lag = out.median_s > 0 ? out.max_s / out.median_s - 1.0 : 0.0;
  out.straggler = fraction > 0 && out.lag > fraction;
  return out;
}

}  // namespace loom
