// Latency of a small collective through MpiProcessGroup: what numbering each collective for the
// timeout's arrival survey (dist/arrival_survey.hpp) adds per call. Run under mpirun:
//   mpirun -np 2 build/bench/bench_collective_latency [iterations] [rounds]
// Each round times `iterations` one-float all-reduces (issue + wait), after a barrier; rank 0
// prints the median round's microseconds per all-reduce, and the best round's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loom/dist/runtime.hpp"

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  loom::DistRuntime runtime;
  auto world = runtime.world();
  float value = 1.0f;
  std::vector<double> us_per_call;
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
    world->barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) world->all_reduce(&value, 1, loom::ReduceOp::Max)->wait();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    if (round > 0) us_per_call.push_back(took.count() / iterations);
  }
  std::sort(us_per_call.begin(), us_per_call.end());
  if (world->rank() == 0)
    std::printf(
        "all_reduce of 1 float on %d ranks: median %.2f us, best %.2f us (%d rounds of %d)\n",
        world->size(), us_per_call[us_per_call.size() / 2], us_per_call.front(), rounds,
        iterations);
  return 0;
}
