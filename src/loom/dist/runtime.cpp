#include "loom/dist/runtime.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/dist/mpi_process_group.hpp"
#ifdef LOOM_HAVE_NCCL
#include "loom/dist/nccl/nccl_process_group.hpp"
#endif

namespace loom {
namespace {

// MPI can be initialised and finalised once per process; these track whether a DistRuntime
// did the initialising and how many runtimes still use it (they are created on the main
// thread only, as MPI_THREAD_FUNNELED requires).
int live_runtimes = 0;
bool runtime_initialised_mpi = false;

const char* env_or_null(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// A launcher's integer variable; a malformed one is a broken launch, not something to guess at.
int env_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || value < 0 || value > INT_MAX)
    throw_error("environment variable ", name, " is '", text, "', expected a non-negative integer");
  return static_cast<int>(value);
}

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw_error("starting the distributed runtime: ", call, " failed with MPI error ", rc);
}

// This rank's index among the ranks on its node, and their count: MPI's shared-memory split
// (the launcher's local rank, where it gives one, takes precedence for the index).
std::pair<int, int> find_node_place() {
  MPI_Comm node_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type");
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node_comm, &local_rank);
  MPI_Comm_size(node_comm, &local_size);
  MPI_Comm_free(&node_comm);
  if (const char* text = env_or_null("OMPI_COMM_WORLD_LOCAL_RANK"))
    local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", text);
  else if (const char* text = env_or_null("SLURM_LOCALID"))
    local_rank = env_int("SLURM_LOCALID", text);
  return {local_rank, local_size};
}

}  // namespace

DistRuntime::DistRuntime() {
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised)
    throw_error(
        "starting the distributed runtime: MPI was already finalised in this process and cannot be "
        "initialised again; keep one DistRuntime alive for the whole run");
  if (!initialised) {
    int provided = MPI_THREAD_SINGLE;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    runtime_initialised_mpi = true;
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      throw_error("starting the distributed runtime: MPI provides thread level ", provided,
                  ", below MPI_THREAD_FUNNELED (", MPI_THREAD_FUNNELED,
                  ") which OpenMP kernels need");
    }
  }
  ++live_runtimes;
  try {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    std::tie(local_rank_, local_size_) = find_node_place();
    MPI_Comm world_copy = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world_copy), "MPI_Comm_dup");
    world_ = std::make_shared<MpiProcessGroup>(world_copy, "world",
                                               MpiProcessGroup::CommOwnership::Owned);
  } catch (...) {
    --live_runtimes;
    throw;
  }
}

DistRuntime::~DistRuntime() {
  world_.reset();  // frees the duplicated communicator while MPI is still up
  --live_runtimes;
  if (live_runtimes == 0 && runtime_initialised_mpi) {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) MPI_Finalize();
  }
}

bool DistRuntime::launched_by_mpi_or_slurm() {
  if (env_or_null("OMPI_COMM_WORLD_SIZE") || env_or_null("PMIX_RANK") || env_or_null("PMI_RANK"))
    return true;
  // srun sets SLURM_PROCID even for one task inside an allocation; only several tasks need MPI.
  const char* tasks = env_or_null("SLURM_NTASKS");
  return env_or_null("SLURM_PROCID") != nullptr && tasks != nullptr && std::atoi(tasks) > 1;
}

bool DistRuntime::nccl_built() {
#ifdef LOOM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::shared_ptr<ProcessGroup> DistRuntime::nccl_world() const {
#ifdef LOOM_HAVE_NCCL
  return std::make_shared<NcclProcessGroup>(MPI_COMM_WORLD, "world");
#else
  throw_error("parallel.backend = \"nccl\": this loom was built without NCCL (no CUDA toolkit or NCCL "
              "at configure time, or -DLOOM_WITH_NCCL=OFF); use parallel.backend = \"mpi\"");
#endif
}

}  // namespace loom
