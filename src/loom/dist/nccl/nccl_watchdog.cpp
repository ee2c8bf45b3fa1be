#include "loom/dist/nccl/nccl_watchdog.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/dist/mpi_process_group.hpp"  // kCommTimeoutExitCode

namespace loom {

NcclWatchdog::NcclWatchdog(ncclComm_t comm, int device, int world_rank, double timeout_seconds)
    : comm_(comm),
      device_(device),
      world_rank_(world_rank),
      timeout_seconds_(timeout_seconds),
      thread_([this] { run(); }) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (const Watched& op : watched_) cudaEventDestroy(op.done);
}

void NcclWatchdog::watch(cudaStream_t stream, std::string description) {
  cudaEvent_t done = nullptr;
  cudaError_t rc = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (rc == cudaSuccess) {
    rc = cudaEventRecord(done, stream);
    if (rc != cudaSuccess) cudaEventDestroy(done);
  }
  if (rc != cudaSuccess)
    throw_error(description, ": the NCCL watchdog's event failed: ", cudaGetErrorString(rc));
  std::lock_guard<std::mutex> lock(mutex_);
  if (gone_) {
    cudaEventDestroy(done);
    return;
  }
  watched_.push_back({done, std::move(description), std::chrono::steady_clock::now()});
}

void NcclWatchdog::step_aside() {
  (void)cudaGetLastError();
  gone_ = true;
  for (const Watched& op : watched_) cudaEventDestroy(op.done);
  watched_.clear();
}

void NcclWatchdog::abort_job(const Watched& op, const std::string& reason) const {
  std::fprintf(stderr, "loom: rank %d: %s %s (NCCL watchdog); aborting the job\n", world_rank_,
               op.description.c_str(), reason.c_str());
  std::fflush(stderr);
  ncclCommAbort(comm_);  // releases kernels spinning on the peer
  std::_Exit(kCommTimeoutExitCode);
}

void NcclWatchdog::run() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  if (cudaSetDevice(device_) != cudaSuccess) return step_aside();  // the group's device
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(20));
    while (!watched_.empty()) {
      const cudaError_t rc = cudaEventQuery(watched_.front().done);
      if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not sticky; the runtime keeps it as the last error
        break;
      }
      if (rc != cudaSuccess) return step_aside();
      cudaEventDestroy(watched_.front().done);
      watched_.pop_front();
    }
    if (watched_.empty()) continue;
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess && async_error != ncclSuccess)
      abort_job(watched_.front(), std::string("failed with NCCL asynchronous error '") +
                                      ncclGetErrorString(async_error) + "'");
    const double waited =
        std::chrono::duration<double>(Clock::now() - watched_.front().enqueued).count();
    if (waited > timeout_seconds_.load()) {
      std::ostringstream reason;
      reason << "did not complete within " << timeout_seconds_.load() << " s";
      abort_job(watched_.front(), reason.str());
    }
  }
}

}  // namespace loom
