#pragma once
// The watchdog of one NCCL group (PyTorch's ProcessGroupNCCL keeps one per group, for the same
// reason): NcclProcessGroup's Work::wait() only orders the caller's stream after an operation, so
// no host thread waits for the operations and none would notice one that never completes (a peer
// gone, a mismatched collective) before the next host synchronisation hung for good. A thread
// follows every operation watched, oldest first (they complete in order on the group's one
// stream), and ends the job naming the oldest that outlives the timeout, or NCCL's asynchronous
// error: ncclCommAbort, then the process exits with kCommTimeoutExitCode (MPI belongs to the main
// thread under MPI_THREAD_FUNNELED; mpirun ends the other ranks). Other CUDA errors are not the
// group's to report: the watchdog stops watching and leaves them to the main thread.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace loom {

class NcclWatchdog {
 public:
  // Starts the thread on `device`; `comm` is what it aborts.
  NcclWatchdog(ncclComm_t comm, int device, int world_rank, double timeout_seconds);
  ~NcclWatchdog();  // stops the thread; the events still watched are destroyed
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // After enqueueing an operation on `stream`: an event recorded there, and its name.
  void watch(cudaStream_t stream, std::string description);
  // Applies to the operations already watched too.
  void set_timeout_seconds(double seconds) { timeout_seconds_ = seconds; }

 private:
  struct Watched {
    cudaEvent_t done = nullptr;
    std::string description;
    std::chrono::steady_clock::time_point enqueued;
  };
  void run();
  void step_aside();  // under mutex_: stop watching after a CUDA error that is not the group's
  [[noreturn]] void abort_job(const Watched& op, const std::string& reason) const;

  ncclComm_t comm_;
  int device_, world_rank_;
  std::atomic<double> timeout_seconds_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Watched> watched_;
  bool stop_ = false;
  bool gone_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace loom
