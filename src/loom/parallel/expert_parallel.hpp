#pragma once
// Expert parallelism's all-to-all over the ep process group: the ExpertExchange that
// mixture-of-experts layers (model/moe) dispatch their tokens to the experts' holders through,
// and bring the outputs home with. Counts travel as f32 (exact below 2^24 rows); rows through
// all_to_allv. It keeps the bytes and seconds its row exchanges took, for the step's metrics
// (the group's CommStats count the same bytes, under all_to_all).
#include <memory>

#include "loom/dist/process_group.hpp"
#include "loom/model/moe.hpp"

namespace loom {

class GroupExpertExchange final : public ExpertExchange {
 public:
  explicit GroupExpertExchange(std::shared_ptr<ProcessGroup> group);
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::vector<int64_t> exchange_counts(std::span<const int64_t> send, int64_t per_rank) override;
  void exchange_rows(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                     std::span<const int64_t> recv_rows) override;

  ProcessGroup& group() const { return *group_; }
  // Row exchanges since the last reset: bytes sent to other ranks (a rank's own rows stay
  // home) and seconds spent waiting for them.
  int64_t row_bytes_sent() const { return row_bytes_sent_; }
  double seconds() const { return seconds_; }
  void reset_counters() {
    row_bytes_sent_ = 0;
    seconds_ = 0;
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
  int64_t row_bytes_sent_ = 0;
  double seconds_ = 0;
};

}  // namespace loom
