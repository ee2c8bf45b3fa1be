// A job with a hung rank: rank 1 never joins the all-reduce (as if stuck in I/O or a dead
// node), so the others can only finish through the communication timeout, which must end the
// whole job with a message naming the rank and the operation. Driven by timeout_rank_dies.sh.
#include <chrono>
#include <cstdio>
#include <thread>

#include "loom/dist/runtime.hpp"

namespace {
// Far longer than the script allows the job, so only the timeout can end it in time.
constexpr auto kHungRankSleep = std::chrono::seconds(120);
}  // namespace

int main() {
  loom::DistRuntime runtime;
  std::shared_ptr<loom::ProcessGroup> world = runtime.world();
  if (world->size() < 2) {
    std::fprintf(stderr, "hang_rank: needs at least 2 ranks, got %d\n", world->size());
    return 2;
  }
  if (world->rank() == 1) {
    std::this_thread::sleep_for(kHungRankSleep);
    return 0;
  }
  float value = 1.0f;
  world->all_reduce(&value, 1, loom::ReduceOp::Sum)->wait();
  std::fprintf(stderr, "hang_rank: rank %d: the all_reduce completed without rank 1\n",
               world->rank());
  return 1;
}
