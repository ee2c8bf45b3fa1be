#pragma once
// The process's MPI lifetime and its place in the job: world rank and size, the rank among the
// processes on this node (which GPU or NUMA domain to take), and the world process group.
#include <memory>

#include "loom/dist/process_group.hpp"

namespace loom {

class DistRuntime {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED: only the creating thread calls MPI) unless something
  // else already did; then MPI is left for that owner to finalise. Throws loom::Error if MPI
  // was already finalised in this process: MPI cannot be initialised twice.
  DistRuntime();
  // The last live DistRuntime finalises MPI if a DistRuntime initialised it.
  ~DistRuntime();
  DistRuntime(const DistRuntime&) = delete;
  DistRuntime& operator=(const DistRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }  // ranks on this node
  // A duplicate of MPI_COMM_WORLD named "world", so loom's traffic never matches messages the
  // application sends on MPI_COMM_WORLD itself.
  std::shared_ptr<ProcessGroup> world() const { return world_; }
  // The world over NCCL instead (collective over every rank): rank r computes on its current
  // CUDA device (see device_memory::select_cuda_device), every rank needs its own GPU. Throws
  // loom::Error in a loom built without NCCL (nccl_built() says which).
  std::shared_ptr<ProcessGroup> nccl_world() const;
  static bool nccl_built();

  // True when a launcher (mpirun/OpenMPI, a PMIx or PMI launcher, or srun with more than one
  // task) started this process, so a plain single-process run can skip MPI entirely.
  static bool launched_by_mpi_or_slurm();

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::shared_ptr<ProcessGroup> world_;
};

}  // namespace loom
