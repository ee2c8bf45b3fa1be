// What a training run measures and reports: losses over the ranks that hold them (the last
// pipeline stage, the replicas, the cp chunks), evaluation, the metrics record's memory, wire
// bytes, expert and context-parallel figures, the ranks' step times (stragglers), and the
// pipeline's drawing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/core/device_memory.hpp"
#include "loom/data/data_loader.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/parallel/context_parallel.hpp"
#include "loom/parallel/expert_parallel.hpp"
#include "loom/train/pipeline_report.hpp"
#include "loom/train/trainer.hpp"

namespace loom {

double Trainer::from_last_stage(double value) const {
  if (!groups_.pp) return value;
  // The other stages add zeros. Two floats, the value and what f32 drops of it, carry it at
  // close to double precision.
  const auto high = static_cast<float>(value);
  float parts[2] = {high, static_cast<float>(value - static_cast<double>(high))};
  if (!model_->holds_head()) parts[0] = parts[1] = 0.0f;
  comm::all_reduce(*groups_.pp, parts, 2, ReduceOp::Sum)->wait();
  return static_cast<double>(parts[0]) + static_cast<double>(parts[1]);
}

double Trainer::mean_loss_over_ranks(double local_sum, double tokens) const {
  const double mean = from_last_stage(local_sum / tokens);
  if (groups_.replica_size == 1) return mean;
  auto v = static_cast<float>(mean);
  comm::all_reduce(*groups_.replicas, &v, 1, ReduceOp::Avg)->wait();
  return v;
}

double Trainer::evaluate(const std::string& pattern, int64_t batches) {
  DataLoader loader = DataLoader::from_pattern(pattern, config_.batch_size, config_.seq_len,
                                               config_.model.vocab_size);
  loader.set_shuffle(kEvalShuffleSeed);
  const int64_t tokens = config_.batch_size * config_.seq_len;
  double total = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next_batch(inputs_.data(), targets_.data());
    total += pipeline_ ? pipeline_->forward_only({inputs_.data(), targets_.data(), 1,
                                                  config_.batch_size, config_.seq_len, tokens})
                       : model_->forward(inputs_.data(), targets_.data(), config_.batch_size,
                                         config_.seq_len, {false, 1.0f});
  }
  // Every dp replica evaluated the same batches; the cp ranks each summed their chunks.
  if (groups_.cp) {
    const auto high = static_cast<float>(total);
    float parts[2] = {high, static_cast<float>(total - static_cast<double>(high))};
    comm::all_reduce(*groups_.cp, parts, 2, ReduceOp::Sum)->wait();
    total = static_cast<double>(parts[0]) + static_cast<double>(parts[1]);
  }
  return from_last_stage(total / static_cast<double>(batches * tokens));
}

nlohmann::json Trainer::step_record(const StepReport& report) const {
  nlohmann::json record = step_report_json(report);
  // This rank's memory by category (peak within the step) and its wire bytes per collective:
  // what the planner's per-rank predictions are checked against.
  const MemStats mem = device_memory::stats(model_->device());
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    record["memory_peak_bytes"][mem_category_name(static_cast<MemCategory>(i))] = mem.peak_bytes[i];
  // Wire bytes per collective, for the dp group and (under tensor parallelism) the tp group.
  auto comm_record = [&](const ProcessGroup& group, const char* key) {
    const CommStats& comm = group.stats();
    for (size_t i = 0; i < kCommOpCount; ++i) {
      if (comm.calls[i] == 0) continue;
      record[key][comm_op_name(static_cast<CommOp>(i))] = {
          {"calls", comm.calls[i]},
          {"bytes_sent", comm.bytes_sent[i]},
          {"bytes_received", comm.bytes_received[i]}};
    }
  };
  if (config_.model.is_moe()) {
    // This rank's experts over the step: balancing and z losses (mean per MoE layer and
    // micro-batch), dropped slots, and the load of the busiest expert over the mean.
    const Transformer::MoeTotals& moe = model_->moe_totals();
    const double calls = std::max<double>(1.0, static_cast<double>(moe.layer_calls));
    record["moe_aux_loss"] = moe.aux / calls;
    record["moe_z_loss"] = moe.z / calls;
    record["moe_dropped_fraction"] =
        moe.routed > 0 ? static_cast<double>(moe.dropped) / static_cast<double>(moe.routed) : 0.0;
    const std::vector<int64_t> counts = moe.expert_counts();
    if (!counts.empty()) {
      double sum = 0, most = 0, squares = 0;
      for (int64_t c : counts)
        sum += static_cast<double>(c), most = std::max(most, static_cast<double>(c));
      const double mean = sum / static_cast<double>(counts.size());
      for (int64_t c : counts)
        squares += (static_cast<double>(c) - mean) * (static_cast<double>(c) - mean);
      const double least = static_cast<double>(*std::min_element(counts.begin(), counts.end()));
      record["moe_load_max_over_mean"] = mean > 0 ? most / mean : 0.0;
      record["moe_load_min_over_mean"] = mean > 0 ? least / mean : 0.0;
      record["moe_load_cv"] =
          mean > 0 ? std::sqrt(squares / static_cast<double>(counts.size())) / mean : 0.0;
    }
  }
  if (config_.model.is_moe() && config_.model.moe_router == MoeRouter::Sigmoid) {
    const std::vector<float> bias = model_->moe_biases();  // this stage's layers (others 0)
    if (!bias.empty()) {
      record["moe_bias_min"] = *std::min_element(bias.begin(), bias.end());
      record["moe_bias_max"] = *std::max_element(bias.begin(), bias.end());
    }
  }
  if (expert_exchange_) {
    // Expert parallelism: the dispatch and combine all-to-alls' rows this rank sent, and the
    // time it waited for them.
    comm_record(expert_exchange_->group(), "comm_ep");
    record["moe_a2a_bytes_sent"] = expert_exchange_->row_bytes_sent();
    record["moe_a2a_ms"] = 1e3 * expert_exchange_->seconds();
  }
  if (groups_.replicas) comm_record(*groups_.replicas, "comm");
  if (groups_.tp) comm_record(*groups_.tp, "comm_tp");
  if (groups_.expert_replicas) comm_record(*groups_.expert_replicas, "comm_experts");
  if (groups_.pp) comm_record(*groups_.pp, "comm_pp");
  if (groups_.cp) {
    comm_record(*groups_.cp, "comm_cp");
    // Attention over the split sequence: its compute, and the communication it did not hide.
    record["cp_attention_ms"] = 1e3 * cp_attention_->timing().compute_s;
    record["cp_exposed_comm_ms"] = 1e3 * cp_attention_->timing().exposed_comm_s;
  }
  return record;
}

RankTimes Trainer::gather_rank_times() {
  const int ranks = control_ ? control_->size() : 1;
  const auto mine = static_cast<float>(compute_seconds_since_log_ /
                                       static_cast<double>(std::max<int64_t>(1, steps_since_log_)));
  compute_seconds_since_log_ = 0;
  steps_since_log_ = 0;
  std::vector<float> all(static_cast<size_t>(ranks), mine);
  if (control_) comm::all_gather(*control_, &mine, all.data(), 1)->wait();
  return compare_rank_times(std::vector<double>(all.begin(), all.end()),
                            config_.straggler_fraction);
}

void Trainer::report_pipeline(int64_t step) {
  const std::string svg = config_.run_dir + "/pipeline.svg";
  const auto bubble =
      report_pipeline_step(*groups_.pp, pipeline_->last_timings(), config_.pp_schedule,
                           config_.grad_accum, config_.pp_chunks, is_rank0() ? svg : "");
  if (!is_rank0()) return;
  std::printf(
      "pipeline step %lld (%s, p = %d, m = %lld, v = %d): bubble measured %.1f%% vs textbook "
      "%.1f%%, "
      "makespan %.1f ms; timeline in %s\n",
      static_cast<long long>(step), schedule_name(config_.pp_schedule), groups_.pp_size,
      static_cast<long long>(config_.grad_accum), config_.pp_chunks, 100 * bubble->measured,
      100 * bubble->textbook, 1e3 * bubble->makespan_s, svg.c_str());
  std::fflush(stdout);
}

}  // namespace loom
