// A job with a rank that never reaches a collective, which the others can only leave through
// the communication timeout: it must end the whole job with a message naming the operation and
// the ranks that did not reach it. Driven by timeout_rank_dies.sh, in two modes:
//   sleep (2+ ranks):    rank 1 sleeps (as if stuck in I/O or on a dead node) and never answers.
//   elsewhere (3 ranks): rank 2 waits in a barrier on a group {1, 2} that rank 1 never joins, so
//                        it answers the survey from there while rank 1 reached the all_reduce.
//   p2p (2 ranks):       a deadlock: rank 0 waits in a recv from rank 1 (tag 5), rank 1 in the
//                        all_reduce rank 0 never joins; rank 0's timeout says where rank 1 is.
// Every rank first completes kWarmupCollectives all-reduces on world, so the hung one is
// all_reduce #(kWarmupCollectives + 1). Only rank 0 has the short timeout, so only it reports.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "loom/dist/runtime.hpp"

namespace {
// Far longer than the script allows the job, so only rank 0's timeout can end it in time.
constexpr auto kHungRankSleep = std::chrono::seconds(120);
constexpr double kOtherRanksTimeoutSeconds = 100.0;
constexpr int kWarmupCollectives = 3;
constexpr int kDeadlockTag = 5;
}  // namespace

int main(int argc, char** argv) {
  const bool elsewhere = argc > 1 && std::strcmp(argv[1], "elsewhere") == 0;
  const bool p2p = argc > 1 && std::strcmp(argv[1], "p2p") == 0;
  loom::DistRuntime runtime;
  std::shared_ptr<loom::ProcessGroup> world = runtime.world();
  const int needed = elsewhere ? 3 : 2;
  if (world->size() < needed) {
    std::fprintf(stderr, "hang_rank: needs at least %d ranks, got %d\n", needed, world->size());
    return 2;
  }
  float value = 1.0f;
  for (int i = 0; i < kWarmupCollectives; ++i)
    world->all_reduce(&value, 1, loom::ReduceOp::Sum)->wait();
  // Split by every rank (MPI_Comm_split is collective on world, though not counted as one of
  // its collectives): ranks 1 and 2 form 'pair', the rest are alone.
  const int rank = world->rank();
  std::shared_ptr<loom::ProcessGroup> pair =
      world->split(rank == 1 || rank == 2 ? 0 : 1 + rank, rank, "pair");
  if (rank != 0) {
    world->set_timeout_seconds(kOtherRanksTimeoutSeconds);
    pair->set_timeout_seconds(kOtherRanksTimeoutSeconds);
  }
  if (p2p && rank == 0) {
    world->recv(&value, 1, 1, kDeadlockTag)->wait();
    std::fprintf(stderr, "hang_rank: rank 0: the recv completed\n");
    return 1;
  }
  if (!p2p && rank == (elsewhere ? 2 : 1)) {
    if (elsewhere)
      pair->barrier();  // rank 1 never joins it
    else
      std::this_thread::sleep_for(kHungRankSleep);
    return 0;
  }
  world->all_reduce(&value, 1, loom::ReduceOp::Sum)->wait();
  std::fprintf(stderr, "hang_rank: rank %d: the all_reduce completed without every rank\n", rank);
  return 1;
}
