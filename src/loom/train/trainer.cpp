#include "loom/train/trainer.hpp"

#include <chrono>
#include <optional>
#include <cstdio>
#include <filesystem>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/data/unigram.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/dist/device_mesh.hpp"
#include "loom/model/flops.hpp"
#include "loom/obs/loss_plot.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/obs/progress.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/parallel/tensor_parallel_plan.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/grad_clip.hpp"

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;

// A resumed run repeats the steps after its checkpoint: their old metric lines go, so the
// file holds each step once.
void drop_metrics_after(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::string kept;
  for (const nlohmann::json& record : MetricsLog::read_all(path))
    if (record.value("step", int64_t{0}) <= step) kept += record.dump() + "\n";
  atomic_write_file(path, kept);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
}  // namespace

Trainer::Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world)
    : config_(std::move(config)), world_(std::move(world)) {
  std::shared_ptr<const ParallelPlan> plan;
  if (world_) {
    world_rank_ = world_->rank();
    if (world_->size() % config_.tp != 0)
      throw_error("launched with ", world_->size(), " rank(s), which is not a multiple of parallel.tp = ",
                  config_.tp, ": launch dp x ", config_.tp, " ranks (", config_.tp, ", ", 2 * config_.tp,
                  ", ...) or change parallel.tp");
    if (config_.tp == 1) {
      dp_ = world_;
    } else {
      DeviceMesh mesh(world_, MeshShape{.dp = world_->size() / config_.tp, .tp = config_.tp});
      dp_ = mesh.group({"dp"});
      tp_ = mesh.group({"tp"});
      tp_size_ = tp_->size();
      plan = std::make_shared<TensorParallelPlan>(tp_, config_.sequence_parallel);
    }
    dp_rank_ = dp_->rank();
    dp_size_ = dp_->size();
  } else if (config_.tp > 1) {
    throw_error("parallel.tp = ", config_.tp, " needs ", config_.tp,
                " ranks: launch under mpirun -np ", config_.tp, " (or srun)");
  }
  if (config_.threads > 0) cpu::set_num_threads(config_.threads);
  model_ = std::make_unique<Transformer>(config_.model, config_.recompute, config_.vocab_chunk, plan);
  model_->init_weights(config_.seed);
  model_->set_bf16_activations(config_.precision == Precision::BF16);
  const bool sharded = dp_size_ > 1 && config_.zero_stage > 0;
  if (!sharded)  // under ZeRO the moments live, sharded, in zero_ (made below)
    optimizer_ = std::make_unique<AdamW>(model_->parameters(), config_.adamw,
                                         config_.precision == Precision::BF16);
  train_loader_ = std::make_unique<DataLoader>(DataLoader::from_pattern(
      config_.train_data, config_.batch_size * dp_size_, config_.seq_len, config_.model.vocab_size));
  if (config_.shuffle) train_loader_->set_shuffle(config_.seed);
  if (!config_.val_data.empty())  // fail now, not at the first evaluation
    (void)DataLoader::from_pattern(config_.val_data, config_.batch_size, config_.seq_len,
                                   config_.model.vocab_size);
  inputs_.resize(static_cast<size_t>(config_.batch_size * config_.seq_len));
  targets_.resize(inputs_.size());
  global_inputs_.resize(inputs_.size() * static_cast<size_t>(dp_size_));
  global_targets_.resize(global_inputs_.size());
  if (!config_.trace_path.empty())
    trace_ = std::make_unique<TraceRecorder>(
        world_ && world_->size() > 1 ? config_.trace_path + ".rank" + std::to_string(world_rank_) : config_.trace_path,
        world_rank_);
  if (sharded) {
    zero_ = std::make_unique<ZeroOptimizer>(
        *model_, dp_,
        ZeroConfig{config_.zero_stage, static_cast<int64_t>(config_.bucket_mb * 1e6), config_.precision == Precision::BF16},
        config_.adamw);
    zero_->set_tensor_parallel_group(tp_);
  } else if (dp_size_ > 1) {
    reducer_ = std::make_unique<GradientBucketReducer>(
        model_->parameters_in_grad_ready_order(), dp_,
        static_cast<int64_t>(config_.bucket_mb * 1e6));
    reducer_->attach(*model_);
  }
}

nlohmann::json Trainer::trainer_state(int64_t step) const {
  const LoaderState loader = train_loader_->state();
  return {{"step", step},
          {"optimizer_steps", optimizer_steps()},
          {"seed", config_.seed},
          {"tokens_seen", step * config_.tokens_per_step()},
          {"loader", {{"epoch", loader.epoch}, {"shard_index", loader.shard_index}, {"position", loader.position}}},
          {"tokens_per_step", global_tokens_per_step()},
          {"precision", config_.precision == Precision::BF16 ? "bf16" : "f32"}};
}

int64_t Trainer::optimizer_steps() const {
  return zero_ ? zero_->steps_taken() : optimizer_->steps_taken();
}

std::vector<OwnedSlice> Trainer::owned_state() {
  // Tensors every tp rank holds whole are written by tp rank 0.
  const bool write_replicated = !tp_ || tp_->rank() == 0;
  if (zero_) return in_whole_tensor_coordinates(zero_->owned_slices(), write_replicated);
  // Replicas hold the same state: the first dp replica's tp ranks write it.
  if (dp_rank_ != 0) return {};
  return in_whole_tensor_coordinates(optimizer_->owned_slices(), write_replicated);
}

std::string Trainer::save(int64_t step) {
  // Under ZeRO or tensor parallelism every rank writes what it owns (collective), in
  // whole-tensor coordinates; otherwise rank 0 writes the single-file format, whose
  // model.safetensors Hugging Face loads as is.
  if (zero_ || tp_)
    return save_sharded_checkpoint(*world_, config_.checkpoint_dir, step, config_.model, trainer_state(step),
                                   owned_state(), static_cast<int>(config_.keep_last));
  if (!is_rank0()) return "";
  return save_checkpoint(config_.checkpoint_dir, step,
                         make_checkpoint_payload(*model_, optimizer_->state_tensors(), trainer_state(step)),
                         static_cast<int>(config_.keep_last));
}

int64_t Trainer::restore(const std::string& dir_or_root) {
  const CheckpointReader reader(dir_or_root);
  require_same_model(config_.model, reader.config(), reader.dir());
  const nlohmann::json& state = reader.trainer_state();
  if (state.value("tokens_per_step", int64_t{0}) != global_tokens_per_step())
    throw_error("checkpoint ", reader.dir(), " was written with ", state.value("tokens_per_step", int64_t{0}),
                " tokens per step, this run uses ", global_tokens_per_step(),
                ": change train.batch_size/seq_len/grad_accum back or start a fresh checkpoint.dir");
  const std::string precision = config_.precision == Precision::BF16 ? "bf16" : "f32";
  if (state.value("precision", std::string("f32")) != precision)
    throw_error("checkpoint ", reader.dir(), " was trained with precision ", state.value("precision", std::string("f32")),
                ", this run asks for ", precision, ": set train.precision back or start a fresh checkpoint.dir");
  const int64_t optimizer_steps = state.value("optimizer_steps", int64_t{0});
  if (zero_) {
    load_owned_state(reader, in_whole_tensor_coordinates(zero_->owned_slices()));
    zero_->set_steps_taken(optimizer_steps);
    zero_->publish_parameters();
  } else {
    load_owned_state(reader, in_whole_tensor_coordinates(optimizer_->owned_slices()));
    optimizer_->set_steps_taken(optimizer_steps);
  }
  const auto& loader = state.at("loader");
  train_loader_->restore({loader.at("epoch").get<int64_t>(), loader.at("shard_index").get<int64_t>(),
                          loader.at("position").get<int64_t>()});
  return state.at("step").get<int64_t>();
}

double Trainer::train_step(int64_t step) {
  if (zero_) zero_->zero_grad();
  else model_->zero_grad();
  const int64_t tokens = config_.batch_size * config_.seq_len;
  // Mean over every token of every micro-batch: each micro-batch's summed loss is scaled so
  // the accumulated gradient equals the gradient of the mean.
  const float grad_scale = 1.0f / static_cast<float>(tokens * config_.grad_accum);
  double loss_sum = 0.0;
  const size_t slice = static_cast<size_t>(dp_rank_ * tokens);  // this rank's rows
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    train_loader_->next_batch(global_inputs_.data(), global_targets_.data());
    if (reducer_) reducer_->set_sync(micro + 1 == config_.grad_accum);
    if (zero_) zero_->set_sync(micro + 1 == config_.grad_accum);
    const double forward_start = TraceRecorder::now_s();
    loss_sum += model_->forward(global_inputs_.data() + slice, global_targets_.data() + slice,
                                config_.batch_size, config_.seq_len, {true, grad_scale});
    const double backward_start = TraceRecorder::now_s();
    model_->backward();
    if (trace_) {
      trace_->span("forward", "compute", forward_start, backward_start);
      trace_->span("backward", "compute", backward_start, TraceRecorder::now_s());
    }
  }
  if (reducer_) {
    reducer_->finish();  // gradients are now the mean over the global batch
    if (trace_)
      for (size_t b = 0; b < reducer_->last_timings().size(); ++b)
        trace_->span("all_reduce bucket " + std::to_string(b), "dp communication",
                     reducer_->last_timings()[b].issued_s, reducer_->last_timings()[b].finished_s);
  }
  const double optimizer_start = TraceRecorder::now_s();
  if (zero_) {
    last_grad_norm_ = zero_->finish_and_step(config_.schedule.at(step), config_.grad_clip);
  } else {
    last_grad_norm_ = global_grad_norm(model_->parameters(), tp_.get());
    optimizer_->step(config_.schedule.at(step), clip_factor(last_grad_norm_, config_.grad_clip));
  }
  if (trace_) trace_->span("clip + AdamW", "compute", optimizer_start, TraceRecorder::now_s());
  return average_over_ranks(loss_sum / static_cast<double>(tokens * config_.grad_accum));
}

nlohmann::json Trainer::step_record(const StepReport& report) const {
  nlohmann::json record = step_report_json(report);
  // This rank's memory by category (peak within the step) and its wire bytes per collective:
  // what the planner's per-rank predictions are checked against.
  const MemStats mem = HostAllocator::instance().stats();
  for (size_t i = 0; i < kMemCategoryCount; ++i)
    record["memory_peak_bytes"][mem_category_name(static_cast<MemCategory>(i))] = mem.peak_bytes[i];
  // Wire bytes per collective, for the dp group and (under tensor parallelism) the tp group.
  auto comm_record = [&](const ProcessGroup& group, const char* key) {
    const CommStats& comm = group.stats();
    for (size_t i = 0; i < kCommOpCount; ++i) {
      if (comm.calls[i] == 0) continue;
      record[key][comm_op_name(static_cast<CommOp>(i))] = {
          {"calls", comm.calls[i]}, {"bytes_sent", comm.bytes_sent[i]}, {"bytes_received", comm.bytes_received[i]}};
    }
  };
  if (dp_) comm_record(*dp_, "comm");
  if (tp_) comm_record(*tp_, "comm_tp");
  return record;
}

double Trainer::average_over_ranks(double value) const {
  if (dp_size_ == 1) return value;
  float v = static_cast<float>(value);
  dp_->all_reduce(&v, 1, ReduceOp::Avg)->wait();
  return v;
}

double Trainer::evaluate(const std::string& pattern, int64_t batches) {
  DataLoader loader = DataLoader::from_pattern(pattern, config_.batch_size, config_.seq_len,
                                               config_.model.vocab_size);
  loader.set_shuffle(kEvalShuffleSeed);
  double total = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    loader.next_batch(inputs_.data(), targets_.data());
    total += model_->forward(inputs_.data(), targets_.data(), config_.batch_size, config_.seq_len,
                             {false, 1.0f});
  }
  return total / static_cast<double>(batches * config_.batch_size * config_.seq_len);
}

TrainSummary Trainer::run() {
  TrainSummary summary;
  std::filesystem::create_directories(config_.run_dir);
  int64_t start_step = 0;
  if (!config_.checkpoint_dir.empty() && config_.resume) {
    if (auto latest = latest_checkpoint(config_.checkpoint_dir)) {
      start_step = restore(*latest);
      if (is_rank0()) std::printf("resumed from %s at step %lld\n", latest->c_str(), static_cast<long long>(start_step));
    }
  }
  summary.first_step = start_step;
  // Rank 0 logs the run; with log.all_ranks every other rank logs its own view (its memory and
  // wire bytes differ under ZeRO) next to it.
  const std::string metrics_path =
      config_.run_dir + (is_rank0() ? "/metrics.jsonl" : "/metrics.rank" + std::to_string(world_rank_) + ".jsonl");
  std::optional<MetricsLog> metrics;
  if (is_rank0() || config_.log_all_ranks) {
    if (start_step > 0) drop_metrics_after(metrics_path, start_step);
    metrics.emplace(metrics_path, start_step > 0 ? MetricsLog::Mode::Append : MetricsLog::Mode::Truncate);
  }

  const double peak_gflops = cpu::measure_sgemm_gflops();  // same measurement as bench/
  // Per-rank FLOPs over the per-rank peak: MFU of one rank, the same for every rank (a tp
  // rank does 1/tp of its replica's work).
  const double flops_per_step = flops_per_token(config_.model, config_.seq_len) *
                                static_cast<double>(config_.tokens_per_step()) / tp_size_;
  if (is_rank0())
    std::printf("model %s: %.2fM parameters, %lld layers, d=%lld | %lld tokens/step | %s, recompute %s | "
              "%d threads, SGEMM peak %.0f GFLOP/s | dp %d x tp %d%s\n",
              architecture_name(config_.model.arch), config_.model.parameter_count() / 1e6,
              static_cast<long long>(config_.model.n_layer), static_cast<long long>(config_.model.n_embd),
              static_cast<long long>(global_tokens_per_step()),
              config_.precision == Precision::BF16 ? "bf16 (fp32 master)" : "f32",
              recompute_name(config_.recompute), cpu::num_threads(), peak_gflops, dp_size_, tp_size_,
              config_.sequence_parallel ? " (sequence parallel)" : "");
  std::fflush(stdout);

  ProgressBar progress = is_rank0() ? ProgressBar(config_.steps) : ProgressBar(config_.steps, stderr, false);
  const auto run_start = Clock::now();
  double compute_seconds = 0.0;
  for (int64_t step = start_step; step < config_.steps; ++step) {
    HostAllocator::instance().reset_peaks();
    if (dp_) dp_->reset_stats();
    if (tp_) tp_->reset_stats();
    const auto step_start = Clock::now();
    const double loss = train_step(step);
    const double step_seconds = seconds_since(step_start);
    compute_seconds += step_seconds;
    if (!std::isfinite(loss)) throw_error("training diverged: loss is ", loss, " at step ", step + 1);
    const StepReport report{step + 1, config_.steps, loss, config_.schedule.at(step), last_grad_norm_,
                            step_seconds * 1e3, static_cast<double>(global_tokens_per_step()) / step_seconds,
                            flops_per_step / step_seconds / (peak_gflops * 1e9),
                            HostAllocator::instance().stats().total_peak_bytes};
    if (metrics) metrics->write(step_record(report));
    summary.last_train_loss = loss;
    summary.steps_done = step + 1;
    const bool last = step + 1 == config_.steps;
    if (is_rank0() && ((step + 1) % config_.log_every == 0 || last || step == start_step)) {
      progress.clear();
      std::printf("%s\n", format_step_line(report).c_str());
      std::fflush(stdout);
    }
    progress.update(step + 1, "loss " + std::to_string(loss).substr(0, 6));
    const bool eval_now = !config_.val_data.empty() &&
                          ((config_.eval_every > 0 && (step + 1) % config_.eval_every == 0) || last);
    if (eval_now) {
      const double val_loss = evaluate(config_.val_data, config_.eval_batches);
      summary.last_val_loss = val_loss;
      if (metrics) metrics->write({{"kind", "val"}, {"step", step + 1}, {"val_loss", val_loss}});
      if (is_rank0()) {
        progress.clear();
        std::printf("step %6lld | val loss %.4f\n", static_cast<long long>(step + 1), val_loss);
        std::fflush(stdout);
      }
    }
    const bool save_now = !config_.checkpoint_dir.empty() &&
                          ((config_.checkpoint_every > 0 && (step + 1) % config_.checkpoint_every == 0) || last);
    if (save_now) summary.last_checkpoint = save(step + 1);
  }
  progress.finish();
  const int64_t steps_run = summary.steps_done - start_step;
  if (steps_run > 0) {
    summary.tokens_per_s = static_cast<double>(steps_run * global_tokens_per_step()) / compute_seconds;
    summary.mfu = flops_per_step * static_cast<double>(steps_run) / compute_seconds / (peak_gflops * 1e9);
  }
  if (trace_) trace_->write();
  if (world_) world_->barrier();  // every rank has finished, and rank 0's last checkpoint is written
  if (!is_rank0()) return summary;
  if (!config_.val_data.empty())
    summary.unigram_baseline = unigram_cross_entropy(config_.train_data, config_.val_data, config_.model.vocab_size);
  write_loss_plot_svg(config_.run_dir + "/loss.svg", MetricsLog::read_all(metrics_path), summary.unigram_baseline);
  std::printf("done: %lld steps in %s (%.0f tokens/s, MFU %.1f%%)\n", static_cast<long long>(steps_run),
              format_duration(seconds_since(run_start)).c_str(), summary.tokens_per_s, 100 * summary.mfu);
  return summary;
}

}  // namespace loom
