#include "loom/parallel/expert_parallel.hpp"

#include <chrono>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"

namespace loom {

GroupExpertExchange::GroupExpertExchange(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  if (!group_) throw_error("expert parallelism: no ep process group");
}

std::vector<int64_t> GroupExpertExchange::exchange_counts(std::span<const int64_t> send, int64_t per_rank) {
  const int64_t ranks = size();
  if (static_cast<int64_t>(send.size()) != ranks * per_rank)
    throw_error("expert parallelism: ", send.size(), " counts for ", ranks, " ranks x ", per_rank);
  constexpr int64_t kExactInF32 = int64_t{1} << 24;
  const auto n = static_cast<int64_t>(send.size());
  // Host tensors: the group takes them as they are (MPI) or stages them (NCCL).
  const Tensor out_f = Tensor::empty({n}, DType::F32, MemCategory::Workspace);
  const Tensor in_f = Tensor::empty({n}, DType::F32, MemCategory::Workspace);
  for (size_t i = 0; i < send.size(); ++i) {
    if (send[i] < 0 || send[i] >= kExactInF32)
      throw_error("expert parallelism: ", send[i], " rows for one expert from one rank, above the ", kExactInF32,
                  " the count exchange carries exactly; use smaller micro-batches");
    out_f.f32()[i] = static_cast<float>(send[i]);
  }
  comm::all_to_all(*group_, out_f, in_f)->wait();
  std::vector<int64_t> received(send.size());
  for (size_t i = 0; i < received.size(); ++i) received[i] = static_cast<int64_t>(in_f.f32()[i]);
  return received;
}

void GroupExpertExchange::exchange_rows(const Tensor& in, std::span<const int64_t> send_rows,
                                        const Tensor& out, std::span<const int64_t> recv_rows) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t width = in.size(1);
  if (out.size(1) != width)
    throw_error("expert parallelism: rows of ", width, " sent, rows of ", out.size(1), " received");
  std::vector<int64_t> send_counts(send_rows.size()), recv_counts(recv_rows.size());
  for (size_t j = 0; j < send_rows.size(); ++j) {
    send_counts[j] = send_rows[j] * width;
    recv_counts[j] = recv_rows[j] * width;
    if (static_cast<int>(j) != rank()) row_bytes_sent_ += send_counts[j] * static_cast<int64_t>(sizeof(float));
  }
  comm::all_to_allv(*group_, in, send_counts, out, recv_counts)->wait();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace loom
