#pragma once
// ProcessGroup over NCCL (the GPU backend): buffers are float* in the memory of this group's
// CUDA device. Every operation is enqueued on the group's own non-blocking stream after an
// event recorded on the legacy default stream (where loom's kernels run): it reads the buffers
// only after the kernels queued before the call have written them, with no host
// synchronisation, and compute queued after the call overlaps it. wait() does not hold the host
// either: the calling thread's current stream waits for the operation (as PyTorch's
// ProcessGroupNCCL's wait does), so results may be used from that stream (and streams forked from
// it) once wait() returns, and from any stream once test() is true; the caller must not overwrite
// a buffer before then. A watchdog thread per group ends the job naming an operation that does
// not complete within the timeout. MPI carries the setup (the NCCL unique id, split) and the
// abort; NCCL carries the data.
//
// Built only when CMake finds CUDA and NCCL (LOOM_HAVE_NCCL); CPU-only builds lack this file.

// Debian's OpenMPI still ships the deprecated MPI-2 C++ bindings, whose headers fail
// -Werror=cast-function-type; loom uses the C API only.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/dist/process_group.hpp"

namespace loom {

// The NCCL communicator, stream and MPI communicator of one group. Defined in the .cpp so
// that this header needs no CUDA include path; every Work holds a share, so they outlive
// every operation enqueued on them even if the group goes first.
struct NcclCommunicator;

// Pass as `device` to use this rank's index among the ranks of `comm` on its node (the local
// rank when `comm` is the world), the usual one-GPU-per-rank launch.
constexpr int kDeviceFromLocalRank = -1;

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Collective over `comm`, which the group duplicates (the caller keeps and frees `comm`).
  // Makes `device` current on the calling thread. Takes the timeout from
  // comm_timeout_seconds_from_env().
  NcclProcessGroup(MPI_Comm comm, std::string name, int device = kDeviceFromLocalRank);
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int device() const { return device_; }
  Device memory() const override { return Device::CUDA; }

  WorkHandle all_reduce(float* data, int64_t count, ReduceOp op) override;
  WorkHandle reduce_scatter(const float* in, float* out, int64_t count_per_rank,
                            ReduceOp op) override;
  WorkHandle all_gather(const float* in, float* out, int64_t count_per_rank) override;
  WorkHandle broadcast(float* data, int64_t count, int root) override;
  WorkHandle all_to_all(const float* in, float* out, int64_t count_per_rank) override;
  WorkHandle all_to_allv(const float* in, const std::vector<int64_t>& send_counts, float* out,
                         const std::vector<int64_t>& recv_counts) override;
  // NCCL has no tags: transfers between two ranks match in the order they are issued, so
  // `tag` is only checked (>= 0, as on MPI). A receive must name the sender's exact count.
  WorkHandle send(const float* data, int64_t count, int peer, int tag) override;
  WorkHandle recv(float* data, int64_t count, int peer, int tag) override;
  WorkHandle send_recv(const float* send_data, int64_t send_count, int send_peer, float* recv_data,
                       int64_t recv_count, int recv_peer, int tag) override;
  void barrier() override;

  std::shared_ptr<ProcessGroup> split(int color, int key, std::string name) override;

  void set_timeout_seconds(double seconds) override;
  double timeout_seconds() const override { return timeout_seconds_; }

 private:
  // What an error message or the timeout report says about an operation on this group.
  std::string describe(const char* op_label) const;
  size_t checked_count(int64_t count, const char* op_label, const char* what) const;
  void check_rank_argument(int value, const char* op_label, const char* what) const;
  void check_peer_argument(int peer, int tag, const char* op_label) const;
  // The Work for what was just enqueued on the group's stream.
  WorkHandle enqueued(std::string description) const;

  std::shared_ptr<NcclCommunicator> nccl_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  int device_ = 0;
  double timeout_seconds_ = 0;
};

}  // namespace loom
