#include "loom/dist/nccl/nccl_process_group.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

#ifdef LOOM_HAVE_CUDA  // the kernels and their streams (core/cuda); else only the legacy stream
#include "loom/core/cuda/stream.hpp"
#endif
#include "loom/core/error.hpp"
#include "loom/dist/backend_support.hpp"
#include "loom/dist/mpi_process_group.hpp"  // the timeout default, its env var and the exit code
#include "loom/dist/nccl/nccl_watchdog.hpp"

namespace loom {

struct NcclCommunicator {
  MPI_Comm mpi_comm = MPI_COMM_NULL;  // our duplicate: setup and split traffic stays private
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* barrier_scratch = nullptr;  // device memory for barrier()'s one-float all-reduce
  cudaEvent_t compute_done = nullptr;  // recorded on the compute stream before each operation
  // Follows every operation enqueued on `stream` (set up once the communicator exists).
  std::unique_ptr<NcclWatchdog> watchdog;

  ~NcclCommunicator() {
    // Destroying a communicator with operations in flight is undefined; they are all on `stream`.
    // The watchdog still runs meanwhile, so a hung operation ends the job instead of this wait.
    if (stream != nullptr) cudaStreamSynchronize(stream);
    watchdog.reset();
    if (comm != nullptr) ncclCommDestroy(comm);
    if (barrier_scratch != nullptr) cudaFree(barrier_scratch);
    if (compute_done != nullptr) cudaEventDestroy(compute_done);
    if (stream != nullptr) cudaStreamDestroy(stream);
    // A group that outlives the runtime must not touch MPI after MPI_Finalize.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi_comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&mpi_comm);
  }
};

namespace {

using namespace backend;

void check_cuda(cudaError_t rc, const char* call, const std::string& context) {
  if (rc != cudaSuccess) throw_error(context, ": ", call, " failed: ", cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* call, const std::string& context) {
  if (rc != ncclSuccess) throw_error(context, ": ", call, " failed: ", ncclGetErrorString(rc));
}

ncclRedOp_t to_nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// Completion of everything enqueued on the group's stream up to its creation.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator> nccl, std::string description, int world_rank,
           double timeout_seconds)
      : nccl_(std::move(nccl)),
        description_(std::move(description)),
        world_rank_(world_rank),
        timeout_seconds_(timeout_seconds) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags", description_);
    const cudaError_t rc = cudaEventRecord(event_, nccl_->stream);
    if (rc != cudaSuccess) cudaEventDestroy(event_);
    check_cuda(rc, "cudaEventRecord", description_);
  }

  // The transfer may still be reading or writing the caller's buffers.
  ~NcclWork() override {
    if (!done_ && !ordered_) {
      try {
        host_wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "loom: rank %d: %s\n", world_rank_, e.what());
      }
    }
    cudaEventDestroy(event_);
  }

  bool test() override {
    if (done_) return true;
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) {
      // The runtime also keeps "not ready" as this thread's last error, which the next kernel
      // launch's check would report as its own failure (PyTorch clears it likewise).
      (void)cudaGetLastError();
      return false;
    }
    check_cuda(rc, "cudaEventQuery", description_);
    done_ = true;
    return true;
  }

  // Stream order, not a host wait: the calling thread's current stream (core/cuda/stream) waits
  // for the operation, so the kernels queued after this call read its results while the host
  // goes on queueing (the communicator's watchdog ends the job if it never completes). Host
  // reads go through copies on that stream, which come after it.
  void wait() override {
    if (done_ || ordered_) return;
    if (test()) return;
#ifdef LOOM_HAVE_CUDA
    const cudaStream_t compute = loom::cuda::current_stream();
#else
    const cudaStream_t compute = cudaStreamLegacy;
#endif
    check_cuda(cudaStreamWaitEvent(compute, event_, 0), "cudaStreamWaitEvent", description_);
    ordered_ = true;
  }

  // The host waits (barrier(), and a Work dropped without wait(): its buffers may be freed).
  void host_wait() {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto timeout = std::chrono::duration<double>(timeout_seconds_);
    while (!test()) {
      // A failed peer connection leaves the kernel spinning forever; NCCL reports it here.
      ncclResult_t async_error = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(nccl_->comm, &async_error), "ncclCommGetAsyncError",
                 description_);
      if (async_error != ncclSuccess)
        abort_job(std::string("failed with NCCL asynchronous error '") +
                  ncclGetErrorString(async_error) + "'");
      const auto waited = Clock::now() - start;
      if (waited > timeout) {
        std::ostringstream reason;
        reason << "did not complete within " << timeout_seconds_ << " s";
        abort_job(reason.str());
      }
      if (waited > kSpinBeforeSleeping) std::this_thread::sleep_for(kSleepBetweenPolls);
    }
  }

 private:
  // A peer that never joins would block this rank (and, through it, everyone else) forever;
  // ending the whole job frees the allocation and names the operation that hung. The NCCL
  // kernels still spin on the GPU, so the communicator is aborted first to release them.
  [[noreturn]] void abort_job(const std::string& reason) const {
    std::fprintf(stderr, "loom: rank %d: %s %s; aborting the job\n", world_rank_,
                 description_.c_str(), reason.c_str());
    std::fflush(stderr);
    ncclCommAbort(nccl_->comm);
    MPI_Abort(MPI_COMM_WORLD, kCommTimeoutExitCode);
    std::abort();  // MPI_Abort does not return
  }

  std::shared_ptr<NcclCommunicator> nccl_;
  std::string description_;
  int world_rank_;
  double timeout_seconds_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
  bool ordered_ = false;  // the caller's stream waits for it (wait())
};

// NCCL has no all-to-all collective; one grouped send and receive per peer is its documented
// recipe (NCCL user guide, "Point-to-point communication", all-to-all). Blocks are packed in
// rank order; empty ones are skipped on both sides, since the counts agree pairwise.
void enqueue_all_to_allv(const NcclCommunicator& nccl, const float* in,
                         const std::vector<int64_t>& send_counts, float* out,
                         const std::vector<int64_t>& recv_counts, const std::string& context) {
  check_nccl(ncclGroupStart(), "ncclGroupStart", context);
  // The group must be closed even when a call inside it fails, or every later NCCL call on
  // this thread would be swallowed into it.
  ncclResult_t rc = ncclSuccess;
  const char* failed_call = "";
  int64_t send_offset = 0;
  int64_t recv_offset = 0;
  for (size_t peer = 0; peer < send_counts.size() && rc == ncclSuccess; ++peer) {
    const auto send_count = static_cast<size_t>(send_counts[peer]);
    const auto recv_count = static_cast<size_t>(recv_counts[peer]);
    if (send_count > 0) {
      rc = ncclSend(in + send_offset, send_count, ncclFloat, static_cast<int>(peer), nccl.comm,
                    nccl.stream);
      failed_call = "ncclSend";
    }
    if (rc == ncclSuccess && recv_count > 0) {
      rc = ncclRecv(out + recv_offset, recv_count, ncclFloat, static_cast<int>(peer), nccl.comm,
                    nccl.stream);
      failed_call = "ncclRecv";
    }
    send_offset += send_counts[peer];
    recv_offset += recv_counts[peer];
  }
  const ncclResult_t end_rc = ncclGroupEnd();
  check_nccl(rc, failed_call, context);
  check_nccl(end_rc, "ncclGroupEnd", context);
}

// Everything a rank can get wrong alone, done before the collective part of the setup.
void open_device(NcclCommunicator& nccl, int device, const std::string& context) {
  int device_count = 0;
  check_cuda(cudaGetDeviceCount(&device_count), "cudaGetDeviceCount", context);
  if (device < 0 || device >= device_count)
    throw_error(context, ": CUDA device ", device, " does not exist; this node has ", device_count,
                " (more ranks per node than GPUs?)");
  check_cuda(cudaSetDevice(device), "cudaSetDevice", context);
  check_cuda(cudaStreamCreateWithFlags(&nccl.stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags", context);
  check_cuda(cudaEventCreateWithFlags(&nccl.compute_done, cudaEventDisableTiming),
             "cudaEventCreateWithFlags", context);
  check_cuda(cudaMalloc(&nccl.barrier_scratch, sizeof(float)), "cudaMalloc", context);
  check_cuda(cudaMemset(nccl.barrier_scratch, 0, sizeof(float)), "cudaMemset", context);
}

// Stream order instead of host synchronisation: the group's stream waits for everything the
// compute stream (the calling thread's current stream, core/cuda/stream: the legacy default
// stream unless a StreamGuard names another) has queued so far, so an operation reads buffers
// only after the kernels that wrote them, and the host never waits.
void after_compute(NcclCommunicator& nccl, const std::string& context) {
#ifdef LOOM_HAVE_CUDA
  const cudaStream_t compute = loom::cuda::current_stream();
#else
  const cudaStream_t compute = cudaStreamLegacy;
#endif
  check_cuda(cudaEventRecord(nccl.compute_done, compute), "cudaEventRecord", context);
  check_cuda(cudaStreamWaitEvent(nccl.stream, nccl.compute_done, 0), "cudaStreamWaitEvent", context);
}

int node_local_rank(MPI_Comm comm, const std::string& context) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", context);
  int local_rank = 0;
  const int rc = MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  check_mpi(rc, "MPI_Comm_rank", context);
  return local_rank;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(MPI_Comm comm, std::string name, int device)
    : nccl_(std::make_shared<NcclCommunicator>()), name_(std::move(name)) {
  if (comm == MPI_COMM_NULL)
    throw_error("process group '", name_, "': the MPI communicator is MPI_COMM_NULL");
  const std::string context = "creating process group '" + name_ + "'";
  check_mpi(MPI_Comm_dup(comm, &nccl_->mpi_comm), "MPI_Comm_dup", context);
  check_mpi(MPI_Comm_rank(nccl_->mpi_comm, &rank_), "MPI_Comm_rank", context);
  check_mpi(MPI_Comm_size(nccl_->mpi_comm, &size_), "MPI_Comm_size", context);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank", context);
  timeout_seconds_ = comm_timeout_seconds_from_env();
  device_ = device == kDeviceFromLocalRank ? node_local_rank(nccl_->mpi_comm, context) : device;

  // ncclCommInitRank has no timeout, so a rank that cannot open its GPU must not leave the
  // others blocked in it: all ranks agree on success first, and all throw if one failed.
  std::string device_error;
  try {
    open_device(*nccl_, device_, context);
  } catch (const Error& e) {
    device_error = e.what();
  }
  const int device_ready = device_error.empty() ? 1 : 0;
  int all_ready = 0;
  check_mpi(MPI_Allreduce(&device_ready, &all_ready, 1, MPI_INT, MPI_MIN, nccl_->mpi_comm),
            "MPI_Allreduce", context);
  if (!device_ready) throw Error(device_error);
  if (!all_ready) throw_error(context, ": another rank could not open its CUDA device");

  // The status travels with the id so that a failure on rank 0 fails every rank, not just it.
  struct UniqueIdMessage {
    ncclResult_t status;
    ncclUniqueId id;
  };
  UniqueIdMessage message{};
  if (rank_ == 0) message.status = ncclGetUniqueId(&message.id);
  check_mpi(MPI_Bcast(&message, static_cast<int>(sizeof(message)), MPI_BYTE, 0, nccl_->mpi_comm),
            "MPI_Bcast", context);
  check_nccl(message.status, "ncclGetUniqueId (on rank 0)", context);
  check_nccl(ncclCommInitRank(&nccl_->comm, size_, message.id, rank_), "ncclCommInitRank", context);
  nccl_->watchdog =
      std::make_unique<NcclWatchdog>(nccl_->comm, device_, world_rank_, timeout_seconds_);
}

NcclProcessGroup::~NcclProcessGroup() = default;

std::string NcclProcessGroup::describe(const char* op_label) const {
  return describe_op(op_label, name_, size_);
}

size_t NcclProcessGroup::checked_count(int64_t count, const char* op_label,
                                       const char* what) const {
  if (count < 0) throw_error(describe(op_label), ": ", what, " is ", count, ", expected >= 0");
  return static_cast<size_t>(count);
}

void NcclProcessGroup::check_rank_argument(int value, const char* op_label,
                                           const char* what) const {
  check_rank(value, size_, describe(op_label), what);
}

void NcclProcessGroup::check_peer_argument(int peer, int tag, const char* op_label) const {
  check_rank_argument(peer, op_label, "peer");
  // Separate operations run one after the other on the stream, so a send to self would wait
  // forever for a receive queued behind it.
  if (peer == rank_)
    throw_error(describe(op_label), ": peer is this rank (", rank_,
                "); NCCL cannot pair a send and a receive to self issued separately");
  if (tag < 0) throw_error(describe(op_label), ": tag is ", tag, ", expected >= 0");
}

WorkHandle NcclProcessGroup::enqueued(std::string description) const {
  nccl_->watchdog->watch(nccl_->stream, description);
  return std::make_shared<NcclWork>(nccl_, std::move(description), world_rank_, timeout_seconds_);
}

WorkHandle NcclProcessGroup::all_reduce(float* data, int64_t count, ReduceOp op) {
  const size_t n = checked_count(count, "all_reduce", "count");
  const std::string context = describe("all_reduce");
  check_buffer(data, count, context, "data");
  stats_.record(CommOp::AllReduce, ring_all_reduce_wire_bytes(count * kFloatBytes, size_));
  after_compute(*nccl_, context);
  check_nccl(ncclAllReduce(data, data, n, ncclFloat, to_nccl_op(op), nccl_->comm, nccl_->stream),
             "ncclAllReduce", context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::reduce_scatter(const float* in, float* out, int64_t count_per_rank,
                                            ReduceOp op) {
  const size_t n = checked_count(count_per_rank, "reduce_scatter", "count_per_rank");
  const std::string context = describe("reduce_scatter");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank * size_, out, count_per_rank, context);
  stats_.record(CommOp::ReduceScatter,
                ring_reduce_scatter_wire_bytes(count_per_rank * kFloatBytes, size_));
  after_compute(*nccl_, context);
  check_nccl(ncclReduceScatter(in, out, n, ncclFloat, to_nccl_op(op), nccl_->comm, nccl_->stream),
             "ncclReduceScatter", context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::all_gather(const float* in, float* out, int64_t count_per_rank) {
  const size_t n = checked_count(count_per_rank, "all_gather", "count_per_rank");
  const std::string context = describe("all_gather");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank, out, count_per_rank * size_, context);
  stats_.record(CommOp::AllGather, ring_all_gather_wire_bytes(count_per_rank * kFloatBytes, size_));
  after_compute(*nccl_, context);
  check_nccl(ncclAllGather(in, out, n, ncclFloat, nccl_->comm, nccl_->stream), "ncclAllGather",
             context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::broadcast(float* data, int64_t count, int root) {
  const size_t n = checked_count(count, "broadcast", "count");
  check_rank_argument(root, "broadcast", "root");
  const std::string context = describe("broadcast");
  check_buffer(data, count, context, "data");
  stats_.record(CommOp::Broadcast,
                chain_broadcast_wire_bytes(count * kFloatBytes, size_, rank_, root));
  after_compute(*nccl_, context);
  check_nccl(ncclBroadcast(data, data, n, ncclFloat, root, nccl_->comm, nccl_->stream),
             "ncclBroadcast", context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::all_to_all(const float* in, float* out, int64_t count_per_rank) {
  checked_count(count_per_rank, "all_to_all", "count_per_rank");
  const std::string context = describe("all_to_all");
  check_buffer(in, count_per_rank, context, "in");
  check_buffer(out, count_per_rank, context, "out");
  check_disjoint(in, count_per_rank * size_, out, count_per_rank * size_, context);
  const int64_t bytes_to_others = (size_ - 1) * count_per_rank * kFloatBytes;
  stats_.record(CommOp::AllToAll, pairwise_all_to_all_wire_bytes(bytes_to_others, bytes_to_others));
  after_compute(*nccl_, context);
  const std::vector<int64_t> counts(static_cast<size_t>(size_), count_per_rank);
  enqueue_all_to_allv(*nccl_, in, counts, out, counts, context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::all_to_allv(const float* in, const std::vector<int64_t>& send_counts,
                                         float* out, const std::vector<int64_t>& recv_counts) {
  const std::string context = describe("all_to_allv");
  check_per_rank_counts(send_counts, recv_counts, size_, context);
  const auto self = static_cast<size_t>(rank_);
  // The block to self is a send and a receive in the same NCCL group; unequal counts would
  // leave one of them unmatched.
  if (send_counts[self] != recv_counts[self])
    throw_error(context, ": send_counts[", rank_, "] is ", send_counts[self], " but recv_counts[",
                rank_, "] is ", recv_counts[self], "; the block a rank sends itself must match");
  const int64_t send_total = sum(send_counts);
  const int64_t recv_total = sum(recv_counts);
  check_buffer(in, send_total, context, "in");
  check_buffer(out, recv_total, context, "out");
  check_disjoint(in, send_total, out, recv_total, context);
  stats_.record(CommOp::AllToAll,
                pairwise_all_to_all_wire_bytes((send_total - send_counts[self]) * kFloatBytes,
                                               (recv_total - recv_counts[self]) * kFloatBytes));
  after_compute(*nccl_, context);
  enqueue_all_to_allv(*nccl_, in, send_counts, out, recv_counts, context);
  return enqueued(context);
}

WorkHandle NcclProcessGroup::send(const float* data, int64_t count, int peer, int tag) {
  const size_t n = checked_count(count, "send", "count");
  check_peer_argument(peer, tag, "send");
  std::ostringstream context;
  context << describe("send") << " to rank " << peer << " (tag " << tag << ")";
  check_buffer(data, count, context.str(), "data");
  stats_.record(CommOp::Send, {count * kFloatBytes, 0});
  after_compute(*nccl_, context.str());
  check_nccl(ncclSend(data, n, ncclFloat, peer, nccl_->comm, nccl_->stream), "ncclSend",
             context.str());
  return enqueued(context.str());
}

WorkHandle NcclProcessGroup::recv(float* data, int64_t count, int peer, int tag) {
  const size_t n = checked_count(count, "recv", "count");
  check_peer_argument(peer, tag, "recv");
  std::ostringstream context;
  context << describe("recv") << " from rank " << peer << " (tag " << tag << ")";
  check_buffer(data, count, context.str(), "data");
  stats_.record(CommOp::Recv, {0, count * kFloatBytes});
  after_compute(*nccl_, context.str());
  check_nccl(ncclRecv(data, n, ncclFloat, peer, nccl_->comm, nccl_->stream), "ncclRecv",
             context.str());
  return enqueued(context.str());
}

WorkHandle NcclProcessGroup::send_recv(const float* send_data, int64_t send_count, int send_peer,
                                       float* recv_data, int64_t recv_count, int recv_peer,
                                       int tag) {
  const size_t n_send = checked_count(send_count, "send_recv", "send_count");
  const size_t n_recv = checked_count(recv_count, "send_recv", "recv_count");
  check_peer_argument(send_peer, tag, "send_recv");
  check_peer_argument(recv_peer, tag, "send_recv");
  std::ostringstream context;
  context << describe("send_recv") << " to rank " << send_peer << ", from rank " << recv_peer
          << " (tag " << tag << ")";
  check_buffer(send_data, send_count, context.str(), "send_data");
  check_buffer(recv_data, recv_count, context.str(), "recv_data");
  check_disjoint(send_data, send_count, recv_data, recv_count, context.str());
  stats_.record(CommOp::Send, {send_count * kFloatBytes, 0});
  stats_.record(CommOp::Recv, {0, recv_count * kFloatBytes});
  after_compute(*nccl_, context.str());
  // One group, closed even when a call inside it fails (see enqueue_all_to_allv).
  check_nccl(ncclGroupStart(), "ncclGroupStart", context.str());
  ncclResult_t rc = ncclSend(send_data, n_send, ncclFloat, send_peer, nccl_->comm, nccl_->stream);
  const char* failed_call = "ncclSend";
  if (rc == ncclSuccess) {
    rc = ncclRecv(recv_data, n_recv, ncclFloat, recv_peer, nccl_->comm, nccl_->stream);
    failed_call = "ncclRecv";
  }
  const ncclResult_t end_rc = ncclGroupEnd();
  check_nccl(rc, failed_call, context.str());
  check_nccl(end_rc, "ncclGroupEnd", context.str());
  return enqueued(context.str());
}

void NcclProcessGroup::barrier() {
  stats_.record(CommOp::Barrier, {});
  if (size_ == 1) return;
  // NCCL has no barrier; an all-reduce completes on no rank before every rank has joined it.
  // It is enqueued directly, not through all_reduce(), so that the stats count one barrier.
  const std::string context = describe("barrier");
  check_nccl(ncclAllReduce(nccl_->barrier_scratch, nccl_->barrier_scratch, 1, ncclFloat, ncclSum,
                           nccl_->comm, nccl_->stream),
             "ncclAllReduce", context);
  // A barrier holds the host: every rank has joined once the one float is reduced here.
  const auto work = std::static_pointer_cast<NcclWork>(enqueued(context));
  work->host_wait();
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::split(int color, int key, std::string name) {
  if (color < 0)
    throw_error(describe("split"), " into '", name, "': color is ", color, ", expected >= 0");
  MPI_Comm new_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(nccl_->mpi_comm, color, key, &new_comm), "MPI_Comm_split",
            describe("split"));
  // The new group duplicates the communicator it is given, so this one is freed either way.
  std::shared_ptr<NcclProcessGroup> group;
  try {
    group = std::make_shared<NcclProcessGroup>(new_comm, std::move(name), device_);
  } catch (...) {
    MPI_Comm_free(&new_comm);
    throw;
  }
  MPI_Comm_free(&new_comm);
  group->set_timeout_seconds(timeout_seconds_);
  return group;
}

void NcclProcessGroup::set_timeout_seconds(double seconds) {
  timeout_seconds_ = checked_timeout(seconds, name_);
  nccl_->watchdog->set_timeout_seconds(timeout_seconds_);
}

}  // namespace loom
