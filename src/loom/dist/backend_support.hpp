#pragma once
// What the MPI and NCCL backends share: argument checks that run before anything is issued,
// the MPI error check (NCCL bootstraps over MPI), and the polling policy of Work::wait().
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::backend {

// Both backends wait by polling (MPI progresses only inside MPI calls; cudaEventSynchronize
// cannot time out): spin for a short while (small operations finish within microseconds),
// then sleep between polls so that oversubscribed ranks leave the core to their peers.
constexpr auto kSpinBeforeSleeping = std::chrono::microseconds(200);
constexpr auto kSleepBetweenPolls = std::chrono::microseconds(50);

constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

// Throws naming `context` and the MPI error text unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* call, const std::string& context);
// Collectives may not read and write overlapping buffers.
void check_disjoint(const float* in, int64_t in_count, const float* out, int64_t out_count,
                    const std::string& context);
void check_buffer(const void* data, int64_t count, const std::string& context, const char* what);
int64_t sum(const std::vector<int64_t>& values);

// "all_reduce on group 'dp' (4 ranks)": how every error and timeout names an operation.
std::string describe_op(const char* op_label, const std::string& group, int size);
// Throws unless 0 <= value < size (a root or a peer).
void check_rank(int value, int size, const std::string& context, const char* what);
// all_to_allv's count vectors: one entry per rank, none negative.
void check_per_rank_counts(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts, int size,
                           const std::string& context);
// Returns `seconds` if it is a usable collective timeout, else throws naming the group.
double checked_timeout(double seconds, const std::string& group);

}  // namespace loom::backend
