#pragma once
// The backend-neutral communication interface: a group of ranks that runs asynchronous
// collectives and point-to-point transfers on f32 host buffers. Parallel layers talk to this,
// never to MPI or NCCL directly, so the same layer code runs on either backend.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/dtype.hpp"

namespace loom {

enum class ReduceOp { Sum, Avg, Max };

// One in-flight operation. Its buffers must stay valid and untouched until wait() returns or
// test() has returned true. wait() and test() must be called from the thread that created the
// runtime (MPI_THREAD_FUNNELED). Dropping the last handle to an unfinished Work that was never
// waited for waits for it on the host, since the transfer may still be reading or writing the
// caller's buffers.
class Work {
 public:
  virtual ~Work() = default;
  // Complete for what the caller does next. MPI: the host blocks until it is (a backend may abort
  // the job on a timeout). NCCL: the calling thread's current CUDA stream waits for it and the
  // host goes on; what that stream (or a stream forked from it) does next sees the result, and
  // the group's watchdog ends the job if it never completes.
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete on the host's view; never blocks
};
using WorkHandle = std::shared_ptr<Work>;

// Several operations as one: complete when every one of them is.
class WorkGroup final : public Work {
 public:
  explicit WorkGroup(std::vector<WorkHandle> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (const WorkHandle& w : parts_) w->wait();
  }
  bool test() override {
    bool done = true;
    for (const WorkHandle& w : parts_) done = w->test() && done;  // test every one: progress
    return done;
  }

 private:
  std::vector<WorkHandle> parts_;
};

enum class CommOp {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  AllToAll,
  Send,
  Recv,
  Barrier,
  kCount
};
constexpr size_t kCommOpCount = static_cast<size_t>(CommOp::kCount);

inline const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::AllReduce: return "all_reduce";
    case CommOp::ReduceScatter: return "reduce_scatter";
    case CommOp::AllGather: return "all_gather";
    case CommOp::Broadcast: return "broadcast";
    case CommOp::AllToAll: return "all_to_all";
    case CommOp::Send: return "send";
    case CommOp::Recv: return "recv";
    case CommOp::Barrier: return "barrier";
    case CommOp::kCount: break;
  }
  return "unknown";
}

// Bytes one rank puts on and takes off the wire for one operation.
struct WireBytes {
  int64_t sent = 0;
  int64_t received = 0;
};

// The traffic model CommStats counts: per-rank bytes of the bandwidth-optimal textbook
// algorithms (ring / chain / pairwise exchange), not whatever the MPI library picked at run
// time, so the figures are a property of the program that a planner can predict. With N = 1
// every figure is 0. Sources: Thakur, Rabenseifner, Gropp, "Optimization of Collective
// Communication Operations in MPICH" (IJHPCA 2005), sections 4.4-4.5; Patarasuk & Yuan,
// "Bandwidth optimal all-reduce algorithms" (JPDC 2009); the NCCL "busbw" factors in
// nccl-tests doc/PERFORMANCE.md (all-reduce 2(N-1)/N, reduce-scatter and all-gather (N-1)/N,
// broadcast 1).

// Ring all-reduce = ring reduce-scatter + ring all-gather over N chunks of the buffer: each
// rank sends and receives 2(N-1) chunks of bytes/N, i.e. 2(N-1)/N * bytes (rounded down to
// whole bytes; exact when the element count divides by N).
inline WireBytes ring_all_reduce_wire_bytes(int64_t payload_bytes, int ranks) {
  const int64_t bytes = 2 * (ranks - 1) * payload_bytes / ranks;
  return {bytes, bytes};
}

// Ring reduce-scatter and ring all-gather: N-1 steps of one block each, i.e. (N-1)/N of the
// N-block total (= (N-1) * block bytes), each way.
inline WireBytes ring_reduce_scatter_wire_bytes(int64_t block_bytes, int ranks) {
  return {(ranks - 1) * block_bytes, (ranks - 1) * block_bytes};
}
inline WireBytes ring_all_gather_wire_bytes(int64_t block_bytes, int ranks) {
  return {(ranks - 1) * block_bytes, (ranks - 1) * block_bytes};
}

// Pipelined chain broadcast along the ring starting at the root (NCCL's algorithm, busbw
// factor 1): every rank but the root receives the payload once; every rank but the last in
// the chain, (root - 1) mod N, forwards it once. No rank moves more than the payload each way.
inline WireBytes chain_broadcast_wire_bytes(int64_t payload_bytes, int ranks, int rank, int root) {
  if (ranks == 1) return {};
  const int last_in_chain = (root + ranks - 1) % ranks;
  return {rank == last_in_chain ? 0 : payload_bytes, rank == root ? 0 : payload_bytes};
}

// Pairwise-exchange all-to-all (Thakur et al. 2005, section 4.5): a rank's own block never
// leaves it; every other block goes straight to its destination. For all_to_allv the
// arguments are the bytes sent to and received from every other rank, own block excluded.
inline WireBytes pairwise_all_to_all_wire_bytes(int64_t bytes_to_others,
                                                int64_t bytes_from_others) {
  return {bytes_to_others, bytes_from_others};
}

// Per-group counters, updated when an operation is issued (not when it completes), so they
// describe what the program asked for even if a wait later times out.
struct CommStats {
  std::array<int64_t, kCommOpCount> bytes_sent{};
  std::array<int64_t, kCommOpCount> bytes_received{};
  std::array<int64_t, kCommOpCount> calls{};

  void record(CommOp op, WireBytes bytes) {
    const auto index = static_cast<size_t>(op);
    bytes_sent[index] += bytes.sent;
    bytes_received[index] += bytes.received;
    calls[index] += 1;
  }
  int64_t sent(CommOp op) const { return bytes_sent[static_cast<size_t>(op)]; }
  int64_t received(CommOp op) const { return bytes_received[static_cast<size_t>(op)]; }
  int64_t count(CommOp op) const { return calls[static_cast<size_t>(op)]; }
};

// A set of ranks that communicate. Every collective must be issued by all ranks of the group
// in the same order (as in MPI and NCCL); several may be outstanding at once and waited for
// in any order. Counts are in elements; arguments are checked before anything is issued, and
// a bad one throws loom::Error on every rank that passes it.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "dp", "dp+tp", ...
  // Where the buffers of this group's operations must live: the host for MPI, the group's GPU
  // for NCCL. dist/tensor_comm stages tensors kept elsewhere through this memory.
  virtual Device memory() const { return Device::CPU; }

  // In place over `count` elements on every rank.
  virtual WorkHandle all_reduce(float* data, int64_t count, ReduceOp op) = 0;
  // `in` holds size() blocks of count_per_rank; rank r gets the reduction of every rank's
  // block r in `out` (count_per_rank elements).
  virtual WorkHandle reduce_scatter(const float* in, float* out, int64_t count_per_rank,
                                    ReduceOp op) = 0;
  // `out` (size() * count_per_rank) gets rank r's `in` as block r.
  virtual WorkHandle all_gather(const float* in, float* out, int64_t count_per_rank) = 0;
  virtual WorkHandle broadcast(float* data, int64_t count, int root) = 0;
  // Block j of rank r's `in` becomes block r of rank j's `out`.
  virtual WorkHandle all_to_all(const float* in, float* out, int64_t count_per_rank) = 0;
  // As all_to_all with per-peer counts; blocks are packed in rank order in both buffers, and
  // recv_counts[j] on rank r must equal send_counts[r] on rank j.
  virtual WorkHandle all_to_allv(const float* in, const std::vector<int64_t>& send_counts,
                                 float* out, const std::vector<int64_t>& recv_counts) = 0;
  virtual WorkHandle send(const float* data, int64_t count, int peer, int tag) = 0;
  virtual WorkHandle recv(float* data, int64_t count, int peer, int tag) = 0;
  // A send to one peer and a receive from another (or the same) as one operation: the exchange
  // of a ring step. Every rank of a ring must issue it in the same order, as a collective: NCCL
  // runs the pair as one group, where two separate calls on its stream could wait on each other
  // around the ring. MPI posts both at once.
  virtual WorkHandle send_recv(const float* send_data, int64_t send_count, int send_peer,
                               float* recv_data, int64_t recv_count, int recv_peer, int tag) {
    WorkHandle sent = send(send_data, send_count, send_peer, tag);
    WorkHandle received = recv(recv_data, recv_count, recv_peer, tag);
    return std::make_shared<WorkGroup>(
        std::vector<WorkHandle>{std::move(sent), std::move(received)});
  }
  virtual void barrier() = 0;  // blocking, under the same timeout as wait()

  // Collective over this group: a new group of the ranks that passed the same `color`,
  // ranked by `key` (ties by rank here). The new group inherits this group's timeout.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key, std::string name) = 0;

  // How long wait() and barrier() may block before the backend gives up on the job.
  virtual void set_timeout_seconds(double seconds) = 0;
  virtual double timeout_seconds() const = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  CommStats stats_;
};

}  // namespace loom
