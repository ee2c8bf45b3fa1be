#include "loom/dist/mpi_process_group.hpp"

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "loom/core/error.hpp"
#include "loom/dist/arrival_survey.hpp"
#include "loom/dist/backend_support.hpp"

namespace loom {
namespace {

using namespace backend;

MPI_Op to_mpi_op(ReduceOp op) {
  return op == ReduceOp::Max ? MPI_MAX : MPI_SUM;  // Avg is a sum divided on completion
}

// An operation that finished when it was issued (collectives on a one-rank group).
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A collective's place on its communicator, so that a timeout can ask who never reached it
// (or a send's or recv's peer, to ask it where it is).
// Its text is made only when needed: building strings for every collective showed up in the
// latency of small all-reduces.
struct CollectiveId {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string group;          // the group's name (short names stay in the string's buffer)
  const char* op_label = "";  // "all_reduce"
  int size = 0;               // ranks in the group
  int64_t seq = 0;            // 0: not a collective (send, recv)
  int peer = -1;              // a send's or recv's peer in the group, else -1

  std::string operation() const { return std::string(op_label) + " #" + std::to_string(seq); }
};

// One MPI request plus what must happen when it completes.
class MpiWork final : public Work {
 public:
  MpiWork(std::string description, int world_rank, double timeout_seconds, CollectiveId id = {})
      : description_(std::move(description)),
        world_rank_(world_rank),
        timeout_seconds_(timeout_seconds),
        id_(std::move(id)) {}

  // MPI forbids freeing a pending collective request and the caller's buffers must outlive
  // the transfer, so dropping an unfinished Work waits for it.
  ~MpiWork() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom: rank %d: %s\n", world_rank_, e.what());
    }
  }

  MPI_Request* request() { return &request_; }
  // ReduceOp::Avg: divide `count` elements at `data` by `divisor` once the sum has arrived.
  void divide_on_completion(float* data, int64_t count, int divisor) {
    average_data_ = data;
    average_count_ = count;
    average_divisor_ = divisor;
  }
  // A recv checks that the message filled the buffer (MPI silently accepts shorter ones).
  void expect_received_floats(int64_t count) { expected_recv_floats_ = count; }
  // MPI_Ialltoallv reads its count and displacement arrays until completion, so they live here.
  std::vector<int>& alltoallv_arrays() { return alltoallv_arrays_; }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) check_mpi(rc, "MPI_Test", description());  // text only on failure
    if (!flag) return false;
    done_ = true;
    finish(status);
    return true;
  }

  void wait() override {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto timeout = std::chrono::duration<double>(timeout_seconds_);
    // Set once the wait outlasts arrival::kAnswerQueriesEvery: the fast path pays for no
    // string and no probe, and a long wait probes for queries only that often.
    std::optional<arrival::WaitScope> blocked_in;
    auto next_answer = arrival::kAnswerQueriesEvery;
    while (!test()) {
      const auto waited = Clock::now() - start;
      if (waited > timeout) abort_job();
      if (waited > next_answer) {
        if (!blocked_in) blocked_in.emplace(description());
        arrival::answer_queries();  // a timed-out peer may be asking who reached what
        next_answer += arrival::kAnswerQueriesEvery;
      }
      if (waited > kSpinBeforeSleeping) std::this_thread::sleep_for(kSleepBetweenPolls);
    }
  }

 private:
  void finish(const MPI_Status& status) {
    if (average_data_ != nullptr) {
      const auto divisor = static_cast<float>(average_divisor_);
      for (int64_t i = 0; i < average_count_; ++i) average_data_[i] /= divisor;
    }
    if (expected_recv_floats_ >= 0) {
      int received = 0;
      MPI_Get_count(&status, MPI_FLOAT, &received);
      if (received != expected_recv_floats_)
        throw_error(description(), ": expected ", expected_recv_floats_,
                    " floats, the message had ", received);
    }
  }

  // A peer that never joins would block this rank (and, through it, everyone else) forever;
  // ending the whole job frees the allocation and names the operation that hung and, for a
  // collective, the ranks that never reached it, for a send or recv where its peer is
  // (arrival_survey.hpp).
  [[noreturn]] void abort_job() const {
    std::string who;
    if (id_.seq > 0) {
      const auto missing = arrival::missing_ranks(id_.comm, id_.seq, arrival::kSurveyGraceSeconds);
      who = "; " + arrival::describe_missing(missing, id_.group, id_.operation(),
                                             arrival::kSurveyGraceSeconds);
    } else if (id_.peer >= 0) {
      const auto peer = arrival::ask(id_.comm, {id_.peer}, arrival::kSurveyGraceSeconds);
      who = "; " + arrival::describe_peer(peer.front(), id_.group, arrival::kSurveyGraceSeconds);
    }
    std::fprintf(stderr, "loom: rank %d: %s did not complete within %g s%s; aborting the job\n",
                 world_rank_, description().c_str(), timeout_seconds_, who.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kCommTimeoutExitCode);
    std::abort();  // MPI_Abort does not return
  }

  // "all_reduce #17 on group 'dp' (2 ranks)" for a collective, else what the constructor got.
  std::string description() const {
    if (id_.seq == 0) return description_;
    return describe_op(id_.operation().c_str(), id_.group, id_.size);
  }

  std::string description_;
  int world_rank_;
  double timeout_seconds_;
  CollectiveId id_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
  float* average_data_ = nullptr;
  int64_t average_count_ = 0;
  int average_divisor_ = 1;
  int64_t expected_recv_floats_ = -1;
  std::vector<int> alltoallv_arrays_;
};

// The Work of a collective just issued on `comm`: numbered there, and described with that
// number ("all_reduce #17 on group 'dp' (2 ranks)") in its timeout report.
std::shared_ptr<MpiWork> collective_work(const char* op_label, MPI_Comm comm,
                                         const std::string& group, int size, int world_rank,
                                         double timeout_seconds) {
  const int64_t seq = arrival::enter_collective(comm);
  return std::make_shared<MpiWork>(std::string(), world_rank, timeout_seconds,
                                   CollectiveId{comm, group, op_label, size, seq});
}

}  // namespace

double comm_timeout_seconds_from_env() {
  const char* text = std::getenv(kCommTimeoutEnvVar);
  if (text == nullptr || *text == '\0') return kDefaultCommTimeoutSeconds;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(seconds) || seconds <= 0)
    throw_error("environment variable ", kCommTimeoutEnvVar, " is '", text,
                "', expected a positive number of seconds");
  return seconds;
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name, CommOwnership ownership)
    : comm_(comm), name_(std::move(name)), ownership_(ownership) {
  if (comm_ == MPI_COMM_NULL)
    throw_error("process group '", name_, "': the MPI communicator is MPI_COMM_NULL");
  const std::string context = "creating process group '" + name_ + "'";
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", context);
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", context);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", context);
  int* tag_upper_bound = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_upper_bound, &found), "MPI_Comm_get_attr",
            context);
  if (found && tag_upper_bound != nullptr) max_tag_ = *tag_upper_bound;
  timeout_seconds_ = comm_timeout_seconds_from_env();
  arrival::attach(comm_);
  max_tag_ = arrival::first_reserved_tag(comm_) - 1;  // the tags above are the survey's
}

MpiProcessGroup::~MpiProcessGroup() {
  arrival::detach(comm_);
  if (ownership_ != CommOwnership::Owned) return;
  // A group that outlives the runtime must not touch MPI after MPI_Finalize.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

std::string MpiProcessGroup::describe(const char* op_label) const {
  return describe_op(op_label, name_, size_);
}

int MpiProcessGroup::checked_count(int64_t count, const char* op_label, const char* what) const {
  if (count < 0) throw_error(describe(op_label), ": ", what, " is ", count, ", expected >= 0");
  // MPI-3 counts are C ints; larger transfers would need derived datatypes or MPI-4's _c calls.
  if (count > INT_MAX)
    throw_error(describe(op_label), ": ", what, " is ", count, ", above the MPI limit of ", INT_MAX,
                " elements per call");
  return static_cast<int>(count);
}

void MpiProcessGroup::check_rank_argument(int value, const char* op_label, const char* what) const {
  check_rank(value, size_, describe(op_label), what);
}

WorkHandle MpiProcessGroup::all_reduce(float* data, int64_t count, ReduceOp op) {
  const int n = checked_count(count, "all_reduce", "count");
  const std::string context = describe("all_reduce");
  check_buffer(data, count, context, "data");
  stats_.record(CommOp::AllReduce, ring_all_reduce_wire_bytes(count * kFloatBytes, size_));
  if (size_ == 1) return std::make_shared<CompletedWork>();  // the reduction of one value is itself

  auto work = collective_work("all_reduce", comm_, name_, size_, world_rank_, timeout_seconds_);
  if (op == ReduceOp::Avg) work->divide_on_completion(data, count, size_);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, to_mpi_op(op), comm_, work->request()),
            "MPI_Iallreduce", context);
  return work;
}

WorkHandle MpiProcessGroup::reduce_scatter(const float* in, float* out, int64_t count_per_rank,
                                           ReduceOp op) {
  const int n = checked_count(count_per_rank, "reduce_scatter", "count_per_rank");
  checked_count(count_per_rank * size_, "reduce_scatter", "count_per_rank * size");
  const std::string context = describe("reduce_scatter");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank * size_, out, count_per_rank, context);
  stats_.record(CommOp::ReduceScatter,
                ring_reduce_scatter_wire_bytes(count_per_rank * kFloatBytes, size_));
  if (size_ == 1) {
    if (count_per_rank > 0)
      std::memcpy(out, in, static_cast<size_t>(count_per_rank) * sizeof(float));
    return std::make_shared<CompletedWork>();
  }

  auto work = collective_work("reduce_scatter", comm_, name_, size_, world_rank_, timeout_seconds_);
  if (op == ReduceOp::Avg) work->divide_on_completion(out, count_per_rank, size_);
  check_mpi(MPI_Ireduce_scatter_block(in, out, n, MPI_FLOAT, to_mpi_op(op), comm_, work->request()),
            "MPI_Ireduce_scatter_block", context);
  return work;
}

WorkHandle MpiProcessGroup::all_gather(const float* in, float* out, int64_t count_per_rank) {
  const int n = checked_count(count_per_rank, "all_gather", "count_per_rank");
  checked_count(count_per_rank * size_, "all_gather", "count_per_rank * size");
  const std::string context = describe("all_gather");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank, out, count_per_rank * size_, context);
  stats_.record(CommOp::AllGather, ring_all_gather_wire_bytes(count_per_rank * kFloatBytes, size_));
  if (size_ == 1) {
    if (count_per_rank > 0)
      std::memcpy(out, in, static_cast<size_t>(count_per_rank) * sizeof(float));
    return std::make_shared<CompletedWork>();
  }

  auto work = collective_work("all_gather", comm_, name_, size_, world_rank_, timeout_seconds_);
  check_mpi(MPI_Iallgather(in, n, MPI_FLOAT, out, n, MPI_FLOAT, comm_, work->request()),
            "MPI_Iallgather", context);
  return work;
}

WorkHandle MpiProcessGroup::broadcast(float* data, int64_t count, int root) {
  const int n = checked_count(count, "broadcast", "count");
  check_rank_argument(root, "broadcast", "root");
  const std::string context = describe("broadcast");
  check_buffer(data, count, context, "data");
  stats_.record(CommOp::Broadcast,
                chain_broadcast_wire_bytes(count * kFloatBytes, size_, rank_, root));
  if (size_ == 1) return std::make_shared<CompletedWork>();

  auto work = collective_work("broadcast", comm_, name_, size_, world_rank_, timeout_seconds_);
  check_mpi(MPI_Ibcast(data, n, MPI_FLOAT, root, comm_, work->request()), "MPI_Ibcast", context);
  return work;
}

WorkHandle MpiProcessGroup::all_to_all(const float* in, float* out, int64_t count_per_rank) {
  const int n = checked_count(count_per_rank, "all_to_all", "count_per_rank");
  checked_count(count_per_rank * size_, "all_to_all", "count_per_rank * size");
  const std::string context = describe("all_to_all");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank * size_, out, count_per_rank * size_, context);
  const int64_t bytes_to_others = (size_ - 1) * count_per_rank * kFloatBytes;
  stats_.record(CommOp::AllToAll, pairwise_all_to_all_wire_bytes(bytes_to_others, bytes_to_others));
  if (size_ == 1) {
    if (count_per_rank > 0)
      std::memcpy(out, in, static_cast<size_t>(count_per_rank) * sizeof(float));
    return std::make_shared<CompletedWork>();
  }

  auto work = collective_work("all_to_all", comm_, name_, size_, world_rank_, timeout_seconds_);
  check_mpi(MPI_Ialltoall(in, n, MPI_FLOAT, out, n, MPI_FLOAT, comm_, work->request()),
            "MPI_Ialltoall", context);
  return work;
}

WorkHandle MpiProcessGroup::all_to_allv(const float* in, const std::vector<int64_t>& send_counts,
                                        float* out, const std::vector<int64_t>& recv_counts) {
  const std::string context = describe("all_to_allv");
  check_per_rank_counts(send_counts, recv_counts, size_, context);
  const auto ranks = static_cast<size_t>(size_);
  for (size_t peer = 0; peer < ranks; ++peer) {  // and each within MPI's int counts
    checked_count(send_counts[peer], "all_to_allv", "a send count");
    checked_count(recv_counts[peer], "all_to_allv", "a recv count");
  }
  // Displacements are C ints too, so each buffer's total must fit one.
  const int64_t send_total =
      checked_count(sum(send_counts), "all_to_allv", "the sum of send_counts");
  const int64_t recv_total =
      checked_count(sum(recv_counts), "all_to_allv", "the sum of recv_counts");
  check_buffer(in, send_total, context, "in");
  check_buffer(out, recv_total, context, "out");
  check_disjoint(in, send_total, out, recv_total, context);
  const auto self = static_cast<size_t>(rank_);
  stats_.record(CommOp::AllToAll,
                pairwise_all_to_all_wire_bytes((send_total - send_counts[self]) * kFloatBytes,
                                               (recv_total - recv_counts[self]) * kFloatBytes));
  if (size_ == 1) {
    if (send_counts[0] != recv_counts[0])
      throw_error(context, ": send_counts[0] is ", send_counts[0], " but recv_counts[0] is ",
                  recv_counts[0], "; a one-rank group sends to itself, so they must match");
    if (send_total > 0) std::memcpy(out, in, static_cast<size_t>(send_total) * sizeof(float));
    return std::make_shared<CompletedWork>();
  }

  auto work = collective_work("all_to_allv", comm_, name_, size_, world_rank_, timeout_seconds_);
  std::vector<int>& arrays =
      work->alltoallv_arrays();  // [send counts | send displs | recv counts | recv displs]
  arrays.assign(4 * ranks, 0);
  int* send_count = arrays.data();
  int* send_displ = send_count + ranks;
  int* recv_count = send_displ + ranks;
  int* recv_displ = recv_count + ranks;
  for (size_t peer = 0; peer < ranks; ++peer) {
    send_count[peer] = static_cast<int>(send_counts[peer]);
    recv_count[peer] = static_cast<int>(recv_counts[peer]);
    if (peer > 0) {
      send_displ[peer] = send_displ[peer - 1] + send_count[peer - 1];
      recv_displ[peer] = recv_displ[peer - 1] + recv_count[peer - 1];
    }
  }
  check_mpi(MPI_Ialltoallv(in, send_count, send_displ, MPI_FLOAT, out, recv_count, recv_displ,
                           MPI_FLOAT, comm_, work->request()),
            "MPI_Ialltoallv", context);
  return work;
}

WorkHandle MpiProcessGroup::send(const float* data, int64_t count, int peer, int tag) {
  const int n = checked_count(count, "send", "count");
  check_rank_argument(peer, "send", "peer");
  if (tag < 0 || tag > max_tag_)
    throw_error(describe("send"), ": tag is ", tag, ", expected [0, ", max_tag_, "]");
  std::ostringstream context;
  context << describe("send") << " to rank " << peer << " (tag " << tag << ")";
  check_buffer(data, count, context.str(), "data");
  stats_.record(CommOp::Send, {count * kFloatBytes, 0});

  auto work = std::make_shared<MpiWork>(context.str(), world_rank_, timeout_seconds_,
                                        CollectiveId{comm_, name_, "send", size_, 0, peer});
  check_mpi(MPI_Isend(data, n, MPI_FLOAT, peer, tag, comm_, work->request()), "MPI_Isend",
            context.str());
  return work;
}

WorkHandle MpiProcessGroup::recv(float* data, int64_t count, int peer, int tag) {
  const int n = checked_count(count, "recv", "count");
  check_rank_argument(peer, "recv", "peer");
  if (tag < 0 || tag > max_tag_)
    throw_error(describe("recv"), ": tag is ", tag, ", expected [0, ", max_tag_, "]");
  std::ostringstream context;
  context << describe("recv") << " from rank " << peer << " (tag " << tag << ")";
  check_buffer(data, count, context.str(), "data");
  stats_.record(CommOp::Recv, {0, count * kFloatBytes});

  auto work = std::make_shared<MpiWork>(context.str(), world_rank_, timeout_seconds_,
                                        CollectiveId{comm_, name_, "recv", size_, 0, peer});
  work->expect_received_floats(count);
  check_mpi(MPI_Irecv(data, n, MPI_FLOAT, peer, tag, comm_, work->request()), "MPI_Irecv",
            context.str());
  return work;
}

void MpiProcessGroup::barrier() {
  stats_.record(CommOp::Barrier, {});
  if (size_ == 1) return;
  // A barrier is where a rank waits longest for a straggler, so it gets the same timeout.
  auto work = collective_work("barrier", comm_, name_, size_, world_rank_, timeout_seconds_);
  check_mpi(MPI_Ibarrier(comm_, work->request()), "MPI_Ibarrier", describe("barrier"));
  work->wait();
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key, std::string name) {
  if (color < 0)
    throw_error(describe("split"), " into '", name, "': color is ", color, ", expected >= 0");
  MPI_Comm new_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &new_comm), "MPI_Comm_split", describe("split"));
  auto group = std::make_shared<MpiProcessGroup>(new_comm, std::move(name), CommOwnership::Owned);
  group->set_timeout_seconds(timeout_seconds_);
  return group;
}

void MpiProcessGroup::set_timeout_seconds(double seconds) {
  timeout_seconds_ = checked_timeout(seconds, name_);
}

}  // namespace loom
