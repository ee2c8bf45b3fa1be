#pragma once
// Which ranks of a group reached a collective (or where a send's or recv's peer is), asked
// after it timed out.
//
// Every communicator a MpiProcessGroup wraps counts the collectives issued on it; MPI requires
// all of its ranks to issue them in the same order, so "collective #17 on this communicator" is
// the same operation on every rank. A rank that times out asks every other rank of the group
// how many collectives it has issued there (a point-to-point query on two reserved tags), and
// the ranks answer from inside their own waits, the only place loom polls MPI while blocked.
// A rank that answers with a count below the timed-out one's, or does not answer within a grace
// period, did not reach it. The hung rank's help is never needed: its silence is the answer.
//
// Why not one-sided reads: passive-target RMA (MPI_Win_lock + MPI_Get of a rank's arrival
// counter) would read a hung rank's memory without it, but only where the transport does RMA in
// hardware or through shared memory; over TCP Open MPI 4.1 emulates it (osc/pt2pt), and the
// target must itself enter MPI for a read to complete. Queries answered by the ranks that did
// arrive work over any transport and across hosts, and cost nothing per collective beyond a
// counter: probing for queries happens only while a rank sleeps in a wait.
// Limits: a rank that did reach the collective but then left MPI (a broadcast's root that
// finished and went on computing) cannot answer, and is reported as "no answer", which the
// message says may mean busy, hung or gone. Single-threaded use, as the runtime's
// MPI_THREAD_FUNNELED level requires.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/dist/mpi_process_group.hpp"  // mpi.h, included the way loom needs it

namespace loom::arrival {

// How often a waiting rank looks for queries: one MPI_Iprobe per attached communicator, each a
// turn of MPI's progress engine, which at every 50 us poll would multiply the CPU a waiting
// rank takes from the computing ranks it shares cores with. Queries come only after a timeout
// of seconds, so a millisecond's delay in answering costs nothing.
constexpr auto kAnswerQueriesEvery = std::chrono::milliseconds(1);
// How long a timed-out rank waits for the answers: ranks that arrived answer within about
// kAnswerQueriesEvery, so well under a second even on an oversubscribed machine; 2 s keeps the
// report well inside a job's teardown.
constexpr double kSurveyGraceSeconds = 2.0;

// Registers a communicator (counted: several groups may wrap one). Must precede its collectives.
void attach(MPI_Comm comm);
void detach(MPI_Comm comm);
// The tags reserved on every attached communicator for queries and answers: the two largest
// the communicator allows. Point-to-point user tags must stay below them.
int first_reserved_tag(MPI_Comm comm);

// Counts a collective issued on `comm`; returns its 1-based number there.
int64_t enter_collective(MPI_Comm comm);

// What this rank is blocked in, for the answers it gives while waiting.
class WaitScope {
 public:
  explicit WaitScope(const std::string& what);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  std::string previous_;
};

// Answers every pending query on every attached communicator (one MPI_Iprobe per communicator
// when there are none).
void answer_queries();

struct PeerReport {
  int rank = 0;        // in the group
  int world_rank = 0;  // in MPI_COMM_WORLD
  bool answered = false;
  int64_t issued = 0;      // collectives it had issued on the communicator
  std::string waiting_in;  // what it was blocked in when it answered ("" if not blocked)
};

// Asks each of `peers` (ranks of `comm`) how far it got and what it is blocked in; one report
// per peer, in order. Waits at most `grace_seconds`, answering others' queries meanwhile.
std::vector<PeerReport> ask(MPI_Comm comm, const std::vector<int>& peers, double grace_seconds);

// Asks every other rank of `comm` about collective `seq`; returns those that did not reach it,
// in rank order.
std::vector<PeerReport> missing_ranks(MPI_Comm comm, int64_t seq, double grace_seconds);

// For a send or recv that timed out: "rank 1 of group 'pp' is waiting in all_reduce #5 on
// group 'dp' (2 ranks)", or that it did not answer.
std::string describe_peer(const PeerReport& peer, const std::string& group, double grace_seconds);

// "ranks 1, 3 (of group 'world') did not reach all_reduce #17 (rank 1: no answer within 2 s,
// busy outside communication, hung or gone; rank 3: at collective #16, waiting in barrier #4
// on group 'tp' (2 ranks))", or a sentence saying every rank arrived.
std::string describe_missing(const std::vector<PeerReport>& missing, const std::string& group,
                             const std::string& operation, double grace_seconds);

}  // namespace loom::arrival
