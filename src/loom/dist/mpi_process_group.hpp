#pragma once
// ProcessGroup over an MPI communicator (the CPU backend). Every operation is a non-blocking
// MPI call; Work::wait() polls it under a timeout so that a dead or hung peer ends the job
// with a message instead of leaving the other ranks blocked forever.

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

// Long enough for the slowest legitimate wait we expect on CPU (a checkpoint save or a first
// compile on one rank while the others sit in a collective), short enough that a hung job
// gives its allocation back within minutes.
constexpr double kDefaultCommTimeoutSeconds = 300.0;
// Overrides kDefaultCommTimeoutSeconds for the world group (and so every group split from it).
constexpr const char* kCommTimeoutEnvVar = "LOOM_COMM_TIMEOUT_S";
// The exit status a timed-out job ends with (MPI_Abort's error code).
constexpr int kCommTimeoutExitCode = 3;

// LOOM_COMM_TIMEOUT_S when set (a positive number of seconds), else kDefaultCommTimeoutSeconds.
double comm_timeout_seconds_from_env();

class MpiProcessGroup final : public ProcessGroup {
 public:
  enum class CommOwnership { Borrowed, Owned };  // Owned: freed when the group is destroyed

  // Takes the timeout from comm_timeout_seconds_from_env().
  MpiProcessGroup(MPI_Comm comm, std::string name, CommOwnership ownership);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

  WorkHandle all_reduce(float* data, int64_t count, ReduceOp op) override;
  WorkHandle reduce_scatter(const float* in, float* out, int64_t count_per_rank,
                            ReduceOp op) override;
  WorkHandle all_gather(const float* in, float* out, int64_t count_per_rank) override;
  WorkHandle broadcast(float* data, int64_t count, int root) override;
  WorkHandle all_to_all(const float* in, float* out, int64_t count_per_rank) override;
  WorkHandle all_to_allv(const float* in, const std::vector<int64_t>& send_counts, float* out,
                         const std::vector<int64_t>& recv_counts) override;
  WorkHandle send(const float* data, int64_t count, int peer, int tag) override;
  WorkHandle recv(float* data, int64_t count, int peer, int tag) override;
  void barrier() override;

  std::shared_ptr<ProcessGroup> split(int color, int key, std::string name) override;

  void set_timeout_seconds(double seconds) override;
  double timeout_seconds() const override { return timeout_seconds_; }

 private:
  // What an error message or the timeout report says about an operation on this group.
  std::string describe(const char* op_label) const;
  int checked_count(int64_t count, const char* op_label, const char* what) const;
  void check_rank_argument(int value, const char* op_label, const char* what) const;

  MPI_Comm comm_;
  std::string name_;
  CommOwnership ownership_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  // Highest tag a send or recv may use: MPI_TAG_UB (at least 32767) less the tags the arrival
  // survey reserves above it (dist/arrival_survey).
  int max_tag_ = 32767;
  double timeout_seconds_ = kDefaultCommTimeoutSeconds;
};

}  // namespace loom
