#include "loom/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/data/unigram.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/flops.hpp"
#include "loom/obs/loss_plot.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/obs/progress.hpp"
#include "loom/obs/step_line.hpp"
#include "loom/optim/grad_clip.hpp"
#include "loom/parallel/context_parallel.hpp"
#include "loom/parallel/expert_parallel.hpp"
#include "loom/parallel/tensor_parallel_plan.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/device_peak.hpp"
#include "loom/train/fp8_config.hpp"
#include "loom/train/launch.hpp"
#include "loom/train/pipeline_report.hpp"

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the engine cannot train on a device, and data it cannot train as asked, are refused
// before anything is built.
TrainConfig checked_for_device(TrainConfig config) {
  check_fp8_training(config);  // first: its refusal of CUDA says what FP8 needs
  if (config.device == Device::CUDA) {
    check_cuda_training(config);
    check_cuda_available();
    const int capability = device_memory::cuda_min_compute_capability();
    if (config.precision == Precision::FP8 && capability < 89)
      throw_error(
          "train.precision = \"fp8\" on CUDA needs FP8 tensor cores (compute capability 8.9 or "
          "later: Ada, Hopper); this GPU is ",
          capability / 10, ".", capability % 10, ": use train.precision = \"bf16\"");
    // cuBLASLt's 128-tile block scaling (VEC128 / BLK128x128) is a Hopper feature; Blackwell
    // scales blocks of 32 (MXFP8), which this recipe's tiles are not.
    if (config.precision == Precision::FP8 && config.fp8.recipe == Fp8Recipe::Blockwise &&
        (capability < 90 || capability >= 100))
      throw_error(
          "train.fp8_recipe = \"blockwise\" on CUDA runs on cuBLASLt's 128-element block-scaled "
          "FP8 GEMMs, which Hopper (compute capability 9.0) has; this GPU is ",
          capability / 10, ".", capability % 10, ": use fp8_recipe = \"delayed\" or \"current\"");
  }
  // Packed documents a row cannot hold are refused before anything is built.
  if (config.document_mask && !config.split_long_documents) {
    for (size_t i = 0; i < config.train_sources.size(); ++i)
      check_documents_fit(expand_shard_pattern(config.train_sources[i].pattern), config.eot_token, config.seq_len,
                          config.train_data.empty() ? "data.sources[" + std::to_string(i) + "]" : "data.train");
    if (!config.val_data.empty())
      check_documents_fit(expand_shard_pattern(config.val_data), config.eot_token, config.seq_len, "data.val");
  }
  return config;
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world)
    : config_(checked_for_device(std::move(config))),
      groups_(make_trainer_groups(config_, std::move(world))),
      bad_steps_(config_.bad_steps) {
  const int world_size = groups_.world ? groups_.world->size() : 1;
  if (world_size > 1) control_ = groups_.world->split(0, groups_.world_rank, "control");
  if ((config_.inject.kill_at_step > 0 || config_.inject.kill_in_checkpoint_write > 0) &&
      config_.inject.kill_rank >= world_size)
    throw_error("config key 'debug.kill_rank' is ", config_.inject.kill_rank, ", but the launch has ", world_size,
                " rank(s)");
  if (config_.inject.slow_rank >= world_size)
    throw_error("config key 'debug.slow_rank' is ", config_.inject.slow_rank, ", but the launch has ", world_size,
                " rank(s): give a world rank below ", world_size, " or -1");
  std::shared_ptr<ParallelPlan> plan;
  if (groups_.tp) plan = std::make_shared<TensorParallelPlan>(groups_.tp, config_.sequence_parallel);
  if (groups_.ep) {
    // The MoE layers build only this rank's experts and dispatch through the ep group.
    if (!plan) plan = std::make_shared<ParallelPlan>();
    expert_exchange_ = std::make_shared<GroupExpertExchange>(groups_.ep);
    plan->set_expert_exchange(expert_exchange_);
  }
  std::vector<ModelChunk> chunks;
  if (groups_.pp)
    chunks = pipeline_chunks(stage_layer_counts(config_.model.n_layer, int64_t{config_.pp} * config_.pp_chunks,
                                                config_.pp_layers, "parallel.pp_layers"),
                             config_.pp, groups_.pp_rank, stage_placement(config_.pp_schedule));
  if (config_.print_schedule && !groups_.pp)
    throw_error("--print-schedule draws the pipeline schedule, and this run has none: set parallel.pp > 1");
  if (config_.threads > 0) cpu::set_num_threads(config_.threads);
  // bf16 storage with fp32 masters: bf16 training, and FP8 on CUDA (bf16 activations and working
  // weights around the FP8 GEMMs, as Transformer Engine keeps them). FP8 on the CPU emulates in
  // f32.
  const bool bf16 = config_.precision == Precision::BF16 ||
                    (config_.precision == Precision::FP8 && config_.device == Device::CUDA);
  const int64_t device_memory =
      config_.device == Device::CUDA ? first_cuda_device_memory_bytes() : 0;
  model_ = std::make_unique<Transformer>(config_.model, config_.recompute,
                                         resolved_vocab_chunk(config_, device_memory), plan, chunks);
  model_->init_weights(config_.seed);
  model_->set_bf16_activations(bf16);
  if (config_.precision == Precision::FP8) {
    Fp8Config fp8 = config_.fp8;
    // A micro-batch's rows are its sequences one after another; under context parallelism
    // each sequence's two chunks on this rank (of seq_len / 2cp tokens each, not adjacent in
    // the sequence): the blockwise recipe's 128 x 1 tiles stay inside such a run of tokens.
    fp8.sequence_rows = config_.cp > 1 ? config_.seq_len / (2 * config_.cp) : config_.seq_len;
    fp8_ = &model_->enable_fp8(fp8);
  }
  if (config_.document_mask) model_->set_document_mask(config_.eot_token, config_.document_positions);
  // The same model on the device: bf16 storage for activations and working weights there.
  if (config_.device == Device::CUDA) model_->to_device(Device::CUDA, bf16 ? DType::BF16 : DType::F32);
  loss_sum_ = std::make_unique<LossSum>(model_->device());
  // Every rank reads the whole global micro-batch and takes its rows; the position counts
  // sequences, so a resume at another dp size reads on where this run stopped.
  train_loader_ = std::make_unique<DataLoader>(
      config_.train_data.empty()
          ? DataLoader::from_sources(config_.train_sources, "data.sources", config_.batch_size * groups_.dp_size,
                                     config_.seq_len, config_.model.vocab_size)
          : DataLoader::from_pattern(config_.train_data, config_.batch_size * groups_.dp_size, config_.seq_len,
                                     config_.model.vocab_size));
  if (config_.shuffle) train_loader_->set_shuffle(config_.seed);
  if (!config_.val_data.empty())  // fail now, not at the first evaluation
    (void)DataLoader::from_pattern(config_.val_data, config_.batch_size, config_.seq_len,
                                   config_.model.vocab_size);
  inputs_.resize(static_cast<size_t>(config_.batch_size * config_.seq_len));
  targets_.resize(inputs_.size());
  global_inputs_.resize(inputs_.size() * static_cast<size_t>(groups_.dp_size * config_.grad_accum));
  global_targets_.resize(global_inputs_.size());
  if (!config_.trace_path.empty())
    trace_ = std::make_unique<TraceRecorder>(
        groups_.world && groups_.world->size() > 1 ? config_.trace_path + ".rank" + std::to_string(groups_.world_rank) : config_.trace_path,
        groups_.world_rank);
  // Gradients are averaged, and ZeRO shards, over every rank that holds the same parameters:
  // dp x cp (x ep) for the dense ones, dp x cp for an expert's.
  if (groups_.cp) {
    cp_attention_ = make_context_attention(groups_.cp, config_.cp_comm);
    if (trace_)
      cp_attention_->set_span_hook([this](const std::string& name, const char* lane, double start, double end) {
        trace_->span(name, lane, start, end);
      });
    model_->set_context_parallel(cp_attention_);
  }
  if (groups_.replica_size > 1 && config_.zero_stage > 0) {
    optimizer_ = std::make_unique<ZeroOptimizer>(
        *model_, groups_.replicas, ZeroConfig{config_.zero_stage, static_cast<int64_t>(config_.bucket_mb * 1e6), bf16},
        config_.adamw, groups_.expert_replicas);
  } else {
    optimizer_ = std::make_unique<AdamW>(model_->parameters(), config_.adamw, bf16);
    if (groups_.replica_size > 1) {
      reducer_ = std::make_unique<GradientBucketReducer>(model_->parameters_in_grad_ready_order(), groups_.replicas,
                                                         static_cast<int64_t>(config_.bucket_mb * 1e6),
                                                         groups_.expert_replicas);
      reducer_->attach(*model_);
    }
  }
  if (fp8_ && groups_.world && groups_.world->size() > groups_.pp_size) {
    // Every rank must scale as one process would: amaxes are reduced (max) over the ranks of
    // its pipeline stage, which hold the same layers: the data- and context-parallel replicas
    // (other rows) and the tensor-parallel ranks (other slices of the weights, of a
    // row-parallel layer's input and of a column-parallel layer's output gradient), on a group
    // of their own so the calls never interleave with the gradient buckets' (Transformer
    // Engine's amax reduction group, which Megatron-LM spans over dp x cp x tp).
    auto reduce_over = [](std::shared_ptr<ProcessGroup> group) {
      return [group](std::span<float> values) {
        comm::all_reduce(*group, values.data(), static_cast<int64_t>(values.size()), ReduceOp::Max)
            ->wait();
      };
    };
    fp8_->context(0).reduce_max =
        reduce_over(groups_.world->split(groups_.pp_rank, groups_.world_rank, "fp8_amax"));
    // A mixture of experts' experts: the ranks of the stage that hold the same experts (the
    // same ep rank), whose rows are other tokens (dp, cp) or, under sequence parallelism,
    // other rows of the same tokens (tp). Every rank makes the group, experts on its stage or
    // not.
    if (fp8_->group_count() > 1) {
      const int ep_rank = groups_.ep ? groups_.ep->rank() : 0;
      fp8_->context(1).reduce_max = reduce_over(groups_.world->split(
          groups_.pp_rank * groups_.ep_size + ep_rank, groups_.world_rank, "fp8_expert_amax"));
    }
  }
  optimizer_->set_model_parallel_groups(groups_.tp, groups_.pp);
  optimizer_->set_expert_parallel_group(groups_.ep);
  if (groups_.pp) {
    const bool overlap = config_.pp_schedule == PipelineSchedule::DualPipeV &&
                         (config_.pp_overlap == "on" ||
                          (config_.pp_overlap == "auto" && config_.device == Device::CUDA));
    pipeline_ = std::make_unique<PipelineExecutor>(*model_, groups_.pp, config_.pp_schedule,
                                                   groups_.embedding, overlap);
  }
}

void Trainer::run_micro_batches(double& loss_sum, float grad_scale) {
  const int64_t tokens = config_.batch_size * config_.seq_len;
  const int64_t global_tokens = tokens * groups_.dp_size;
  const size_t slice = static_cast<size_t>(groups_.dp_rank * tokens);  // this rank's rows
  auto set_sync = [&](bool sync) {
    if (reducer_) reducer_->set_sync(sync);
    optimizer_->set_sync(sync);
  };
  if (pipeline_) {
    // The schedule needs every micro-batch at hand; every stage reads the same data.
    for (int64_t micro = 0; micro < config_.grad_accum; ++micro)
      train_loader_->next_batch(global_inputs_.data() + micro * global_tokens,
                                global_targets_.data() + micro * global_tokens);
    const double start = TraceRecorder::now_s();
    loss_sum += pipeline_->train_step(
        {global_inputs_.data() + slice, global_targets_.data() + slice, config_.grad_accum,
         config_.batch_size, config_.seq_len, global_tokens},
        grad_scale, set_sync, loss_sum_.get());
    if (trace_)
      for (const ActionTiming& t : pipeline_->last_timings())
        trace_->span((std::string(op_letter(t.op)) + " mb ") + std::to_string(t.micro_batch) + " chunk " +
                         std::to_string(t.chunk),
                     "compute", start + t.start_s, start + t.end_s);
    return;
  }
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    train_loader_->next_batch(global_inputs_.data(), global_targets_.data());
    set_sync(micro + 1 == config_.grad_accum);
    const double forward_start = TraceRecorder::now_s();
    loss_sum +=
        model_->forward(global_inputs_.data() + slice, global_targets_.data() + slice,
                        config_.batch_size, config_.seq_len, {true, grad_scale, loss_sum_.get()});
    const double backward_start = TraceRecorder::now_s();
    model_->backward();
    if (trace_) {
      trace_->span("forward", "compute", forward_start, backward_start);
      trace_->span("backward", "compute", backward_start, TraceRecorder::now_s());
    }
  }
}

bool Trainer::inject_now(const std::vector<int64_t>& steps, int64_t step) {
  if (std::find(steps.begin(), steps.end(), step + 1) == steps.end()) return false;
  const std::pair<int64_t, bool> key{step, &steps == &config_.inject.nan_at_steps};
  if (std::find(fired_.begin(), fired_.end(), key) != fired_.end()) return false;
  fired_.push_back(key);
  return true;
}

BadStepVerdict Trainer::agree_bad_step(BadStepVerdict local) const {
  if (!control_) return local;
  // One max over the world carries the worst verdict and the highest rank that gave it:
  // kind x 2^22 + rank, exact in a float below 2^24 (ranks under 4M).
  constexpr float kRanks = 4194304.0f;
  float code = local.bad() ? static_cast<float>(local.kind) * kRanks + static_cast<float>(groups_.world_rank) : 0.0f;
  comm::all_reduce(*control_, &code, 1, ReduceOp::Max)->wait();
  const auto kind = static_cast<BadStep>(static_cast<int>(code / kRanks));
  if (kind == local.kind) return local;
  const int rank = static_cast<int>(code - static_cast<float>(kind) * kRanks);
  return {kind, std::string(bad_step_name(kind)) + " on rank " + std::to_string(rank)};
}

Trainer::StepOutcome Trainer::train_step(int64_t step) {
  optimizer_->zero_grad();
  model_->reset_moe_totals();
  // This rank's tokens of a micro-batch: its cp chunks of each sequence.
  const int64_t tokens = config_.batch_size * config_.seq_len / groups_.cp_size;
  // Mean over this rank's tokens of every micro-batch: each micro-batch's summed loss is scaled
  // so the accumulated gradient equals the gradient of the mean; averaging over dp x cp (equal
  // token counts) then gives the gradient of the global batch's mean.
  float grad_scale = 1.0f / static_cast<float>(tokens * config_.grad_accum);
  // [debug] faults strike the last rank alone (it holds the last pipeline stage's loss): NaN
  // gradients spread through the reductions as an overflow would; a spike stays in its own
  // view of the loss, so only the agreement below tells the other ranks.
  const bool last_rank = !groups_.world || groups_.world_rank + 1 == groups_.world->size();
  const bool inject_nan = inject_now(config_.inject.nan_at_steps, step);
  const bool inject_spike = inject_now(config_.inject.loss_spike_at_steps, step);
  if (inject_nan && last_rank) grad_scale = std::numeric_limits<float>::quiet_NaN();
  double loss_sum = 0.0;
  loss_sum_->reset();
  const auto compute_start = Clock::now();
  if (config_.inject.slow_rank == groups_.world_rank && config_.inject.slow_rank_ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.inject.slow_rank_ms));
  if (fp8_) fp8_->begin_step();
  run_micro_batches(loss_sum, grad_scale);
  // The host ran ahead of the GPU (nothing in the micro-batches waits for it): the compute a
  // straggler report compares ends when the compute stream has done it (not the communication
  // streams: a bucket's all-reduce waits for the slowest peer, and every rank would look alike).
  device_memory::synchronize_stream(model_->device());
  compute_seconds_since_log_ += seconds_since(compute_start);
  ++steps_since_log_;
  if (reducer_) {
    reducer_->finish();  // gradients are now the mean over the global batch
    if (trace_)
      for (size_t b = 0; b < reducer_->last_timings().size(); ++b)
        trace_->span("all_reduce bucket " + std::to_string(b), "dp communication",
                     reducer_->last_timings()[b].issued_s, reducer_->last_timings()[b].finished_s);
  }
  const double optimizer_start = TraceRecorder::now_s();
  StepOutcome outcome;
  outcome.grad_norm = optimizer_->finish_gradients();
  loss_sum += loss_sum_->read();  // the one wait for the micro-batches' losses
  outcome.loss = mean_loss_over_ranks(loss_sum, static_cast<double>(tokens * config_.grad_accum));
  // A spike in the last rank's view alone: the ranks disagree until they agree below.
  if (inject_spike && last_rank) outcome.loss *= config_.inject.loss_spike_scale;
  if (config_.bad_steps.skip) {
    // Every rank must take the same decision, or replicas would part ways: the pipeline's
    // first stages never see the loss, and under plain dp each replica has its own norm.
    outcome.bad = agree_bad_step(bad_steps_.judge(outcome.loss, outcome.grad_norm));
    bad_steps_.record(outcome.bad.bad(), outcome.loss);
  }
  // The step's amaxes join the histories (a skipped step's do not), reduced over the replicas.
  if (fp8_) fp8_->finish_step(!outcome.bad.bad());
  if (outcome.bad.bad()) {
    // Nothing moves: weights, moments, masters, ZeRO shards, the step count the bias
    // correction reads and the MoE routers' biases stay; the gradients are cleared.
    optimizer_->skip_update();
  } else {
    optimizer_->update(config_.schedule.at(step), clip_factor(outcome.grad_norm, config_.grad_clip));
    update_moe_bias();
  }
  if (trace_) trace_->span(outcome.bad.bad() ? "skipped update" : "clip + AdamW", "compute", optimizer_start,
                           TraceRecorder::now_s());
  return outcome;
}

Trainer::Rollback Trainer::roll_back() {
  if (checkpointer_) checkpointer_->finish();  // the newest save is the one to return to
  const std::optional<std::string> latest = latest_checkpoint(config_.checkpoint_dir);
  if (!latest) throw_error("bad_steps.rollback_after: no checkpoint under '", config_.checkpoint_dir, "' to return to");
  const LoaderState data_position = train_loader_->state();
  const nlohmann::json counters = bad_steps_.state();
  Rollback rollback{*latest, restore(*latest)};
  bad_steps_.restore_counters(counters);  // the checkpoint's loss window, this run's counts
  train_loader_->restore(data_position);
  optimizer_->zero_grad();
  return rollback;
}

// DeepSeek-V3's auxiliary-loss-free balancing: each MoE layer's selection bias follows the
// step's loads, counted over every replica (dp x cp), so all replicas keep the same bias.
void Trainer::update_moe_bias() {
  if (config_.model.moe_bias_rate <= 0) return;
  std::vector<std::vector<int64_t>> block_counts = model_->moe_totals().block_counts;
  // Under sequence parallelism each tp rank routed its own rows: their counts add up too.
  std::vector<ProcessGroup*> over;
  if (groups_.replica_size > 1) over.push_back(groups_.replicas.get());
  if (groups_.tp && config_.sequence_parallel) over.push_back(groups_.tp.get());
  for (ProcessGroup* group : over)
    for (std::vector<int64_t>& counts : block_counts) {
      if (counts.empty()) continue;
      std::vector<float> values(counts.begin(), counts.end());  // exact below 2^24 slots
      comm::all_reduce(*group, values.data(), static_cast<int64_t>(values.size()), ReduceOp::Sum)->wait();
      for (size_t e = 0; e < counts.size(); ++e) counts[e] = static_cast<int64_t>(values[e]);
    }
  model_->update_moe_bias(block_counts);
}

TrainSummary Trainer::run() {
  TrainSummary summary;
  std::filesystem::create_directories(config_.run_dir);
  int64_t start_step = 0;
  bool resumed = false;
  if (!config_.checkpoint_dir.empty() && is_rank0()) {
    // What a kill during a save left: never loaded (it has no manifest), and removed here.
    for (const auto& partial : ckpt_files::remove_partial_checkpoints(config_.checkpoint_dir))
      std::printf("removed partial checkpoint %s (a save that never completed)\n",
                  partial.string().c_str());
  }
  if (!config_.checkpoint_dir.empty() && config_.checkpoint_async)
    checkpointer_ = std::make_unique<AsyncCheckpointer>(checkpoint_options(), control_ ? control_ : groups_.world);
  if (!config_.checkpoint_dir.empty() && config_.resume) {
    if (auto latest = latest_checkpoint(config_.checkpoint_dir)) {
      start_step = restore(*latest);
      resumed = true;
      if (is_rank0()) std::printf("resumed from %s at step %lld\n", latest->c_str(), static_cast<long long>(start_step));
    }
  }
  if (!resumed && !config_.init_from.empty()) {
    initialise_from(config_.init_from);
    if (is_rank0()) std::printf("initialised from %s\n", config_.init_from.c_str());
  }
  summary.first_step = start_step;
  // A rollback needs a checkpoint to return to from the first step on.
  if (config_.bad_steps.rollback_after > 0 && !latest_checkpoint(config_.checkpoint_dir)) save(start_step);
  // Rank 0 logs the run; with log.all_ranks every other rank logs its own view (its memory and
  // wire bytes differ under ZeRO) next to it.
  const std::string metrics_path =
      config_.run_dir + (is_rank0() ? "/metrics.jsonl" : "/metrics.rank" + std::to_string(groups_.world_rank) + ".jsonl");
  std::optional<MetricsLog> metrics;
  if (is_rank0() || config_.log_all_ranks) {
    if (start_step > 0) drop_metrics_after(metrics_path, start_step);
    metrics.emplace(metrics_path, start_step > 0 ? MetricsLog::Mode::Append : MetricsLog::Mode::Truncate);
  }

  // The peak MFU is measured against, and the device as the first line names it.
  const RunDevice run_device =
      describe_run_device(model_->device(), model_->compute_dtype(), config_.model.head_dim());
  const double peak_gflops = run_device.peak_gflops;
  // Per-rank FLOPs over the per-rank peak: MFU of one rank (a tp rank does 1/tp of its
  // replica's work, a pipeline stage 1/pp of it, evenly split).
  const double flops_per_step = flops_per_token(config_.model, config_.seq_len) *
                                static_cast<double>(config_.tokens_per_step()) /
                                (groups_.tp_size * groups_.pp_size * groups_.cp_size);
  if (is_rank0())
    std::printf(
        "model %s: %.2fM parameters, %lld layers, d=%lld | %lld tokens/step | %s, recompute %s | "
        "%s | dp %d%s x cp %d x tp %d%s x pp %d%s\n",
        architecture_name(config_.model.arch), config_.model.parameter_count() / 1e6,
        static_cast<long long>(config_.model.n_layer), static_cast<long long>(config_.model.n_embd),
        static_cast<long long>(global_tokens_per_step()),
        config_.precision == Precision::BF16  ? "bf16 (fp32 master)"
        : config_.precision == Precision::FP8 ? "fp8 linears (fp32 master)"
                                              : "f32",
        recompute_name(config_.recompute), run_device.description.c_str(), groups_.dp_size,
        groups_.ep ? (" (ep " + std::to_string(groups_.ep_size) + ")").c_str() : "",
        groups_.cp_size, groups_.tp_size, config_.sequence_parallel ? " (sequence parallel)" : "",
        groups_.pp_size,
        groups_.pp ? (std::string(" (") + schedule_name(config_.pp_schedule) + ", " +
                      std::to_string(config_.grad_accum) + " micro-batches)")
                         .c_str()
                   : "");
  std::fflush(stdout);

  ProgressBar progress = is_rank0() ? ProgressBar(config_.steps) : ProgressBar(config_.steps, stderr, false);
  const auto run_start = Clock::now();
  double compute_seconds = 0.0;
  bool checkpoint_pending = false;
  mark_launch_started();  // past every check: a failure from here on is worth a relaunch
  for (int64_t step = start_step; step < config_.steps; ++step) {
    if (config_.inject.kill_at_step == step + 1 && config_.inject.kill_rank == groups_.world_rank &&
        launch_attempt() == 0) {
      std::fprintf(stderr, "debug.kill_at_step: rank %d kills itself at step %lld\n", groups_.world_rank,
                   static_cast<long long>(step + 1));
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
    device_memory::reset_peaks(model_->device());
    if (groups_.replicas) groups_.replicas->reset_stats();
    if (groups_.cp) {
      groups_.cp->reset_stats();
      cp_attention_->reset_timing();
    }
    if (groups_.tp) groups_.tp->reset_stats();
    if (groups_.pp) groups_.pp->reset_stats();
    if (expert_exchange_) {
      groups_.ep->reset_stats();
      expert_exchange_->reset_counters();
    }
    if (groups_.expert_replicas) groups_.expert_replicas->reset_stats();
    const bool draw_pipeline = config_.print_schedule && step + 1 == config_.steps;
    if (draw_pipeline) groups_.pp->barrier();  // one start for every stage's clock
    const auto step_start = Clock::now();
    const LoaderState data_position = train_loader_->state();  // where this step's batches start
    const StepOutcome outcome = train_step(step);
    if (checkpointer_) checkpointer_->step_done();
    const double loss = outcome.loss;
    const double step_seconds = seconds_since(step_start);
    if (draw_pipeline) report_pipeline(step + 1);
    compute_seconds += step_seconds;
    if (!config_.bad_steps.skip && !std::isfinite(loss))
      throw_error("training diverged: loss is ", loss, " at step ", step + 1);
    const StepReport report{step + 1, config_.steps, loss, config_.schedule.at(step), outcome.grad_norm,
                            step_seconds * 1e3, static_cast<double>(global_tokens_per_step()) / step_seconds,
                            peak_gflops > 0 ? flops_per_step / step_seconds / (peak_gflops * 1e9) : 0.0,
                            device_memory::stats(model_->device()).total_peak_bytes};
    const nlohmann::json position_json = loader_state_json(data_position);
    // Every log point (the same steps on every rank), each rank's compute time per step since
    // the last one, gathered over the world.
    std::optional<RankTimes> rank_times;
    if ((step + 1) % config_.log_every == 0 || step + 1 == config_.steps) rank_times = gather_rank_times();
    if (rank_times && rank_times->straggler && is_rank0()) {
      progress.clear();
      std::printf("step %lld: rank %d is a straggler: forward + backward %.1f ms/step, %.0f%% above the median "
                  "rank's %.1f ms (fastest %.1f ms; log.straggler_fraction = %g)\n",
                  static_cast<long long>(step + 1), rank_times->slowest_rank, 1e3 * rank_times->max_s,
                  100 * rank_times->lag, 1e3 * rank_times->median_s, 1e3 * rank_times->min_s, config_.straggler_fraction);
      std::fflush(stdout);
    }
    if (metrics) {
      nlohmann::json record = step_record(report);
      record["skipped_steps"] = bad_steps_.skipped_total();
      if (rank_times) {
        record["rank_compute_ms"] = {{"min", 1e3 * rank_times->min_s}, {"median", 1e3 * rank_times->median_s},
                                     {"max", 1e3 * rank_times->max_s}, {"slowest_rank", rank_times->slowest_rank}};
        if (rank_times->straggler) {
          record["straggler_rank"] = rank_times->slowest_rank;
          record["straggler_lag"] = rank_times->lag;
        }
      }
      if (outcome.bad.bad()) {
        record["skipped"] = true;
        record["bad_step"] = outcome.bad.reason;
        record["data_position"] = position_json;
      }
      metrics->write(record);
    }
    if (outcome.bad.bad() && is_rank0()) {
      progress.clear();
      std::printf("step %lld skipped: %s (loss %.4g, grad norm %.4g); its data from sequence %lld on; "
                  "%lld skipped so far, %lld in a row\n",
                  static_cast<long long>(step + 1), outcome.bad.reason.c_str(), loss, outcome.grad_norm,
                  static_cast<long long>(data_position.sequences), static_cast<long long>(bad_steps_.skipped_total()),
                  static_cast<long long>(bad_steps_.bad_in_a_row()));
      std::fflush(stdout);
    }
    if (!outcome.bad.bad()) summary.last_train_loss = loss;
    summary.steps_done = step + 1;
    summary.skipped_steps = bad_steps_.skipped_total();
    if (bad_steps_.rollback_due()) {
      const int64_t in_a_row = bad_steps_.bad_in_a_row();
      bad_steps_.count_rollback(step + 1);  // throws past bad_steps.max_rollbacks
      const Rollback rollback = roll_back();
      const LoaderState resume_at = train_loader_->state();
      summary.rollbacks = bad_steps_.rollbacks();
      if (metrics)
        metrics->write({{"kind", "rollback"}, {"step", step + 1}, {"to_step", rollback.to_step},
                        {"checkpoint", rollback.checkpoint}, {"bad_in_a_row", in_a_row},
                        {"data_resumes_at", loader_state_json(resume_at)}});
      if (is_rank0()) {
        progress.clear();
        std::printf("step %lld: %lld bad steps in a row: rolled back to %s (step %lld); the data read since it "
                    "is skipped, training goes on from sequence %lld (rollback %lld of at most %lld)\n",
                    static_cast<long long>(step + 1), static_cast<long long>(in_a_row), rollback.checkpoint.c_str(),
                    static_cast<long long>(rollback.to_step), static_cast<long long>(resume_at.sequences),
                    static_cast<long long>(bad_steps_.rollbacks()), static_cast<long long>(config_.bad_steps.max_rollbacks));
        std::fflush(stdout);
      }
      checkpoint_pending = false;
      step = rollback.to_step - 1;  // the loop's ++ makes it the checkpoint's next step
      continue;
    }
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
    // A checkpoint due at a skipped step waits for the next good one (or the last step), so that
    // a rollback never returns into a run of bad steps.
    checkpoint_pending = checkpoint_pending ||
                         (!config_.checkpoint_dir.empty() &&
                          ((config_.checkpoint_every > 0 && (step + 1) % config_.checkpoint_every == 0) || last));
    if (checkpoint_pending && (!outcome.bad.bad() || last)) {
      std::vector<nlohmann::json> records;
      summary.last_checkpoint = checkpoint_in_run(step + 1, records);
      if (metrics)
        for (const nlohmann::json& record : records) metrics->write(record);
      checkpoint_pending = false;
    }
  }
  if (checkpointer_) {  // the last save is committed before the run counts as done
    const std::string dir = checkpointer_->finish();
    if (!dir.empty()) summary.last_checkpoint = dir;
    if (metrics)
      for (const nlohmann::json& record : checkpointer_->take_records()) metrics->write(record);
  }
  progress.finish();
  const int64_t steps_run = summary.steps_done - start_step;
  if (steps_run > 0) {
    summary.tokens_per_s = static_cast<double>(steps_run * global_tokens_per_step()) / compute_seconds;
    if (peak_gflops > 0)
      summary.mfu = flops_per_step * static_cast<double>(steps_run) / compute_seconds / (peak_gflops * 1e9);
  }
  if (trace_) trace_->write();
  if (groups_.world) groups_.world->barrier();  // every rank has finished, and rank 0's last checkpoint is written
  if (!is_rank0()) return summary;
  if (!config_.val_data.empty())
    summary.unigram_baseline = unigram_cross_entropy(config_.train_sources, config_.val_data, config_.model.vocab_size);
  write_loss_plot_svg(config_.run_dir + "/loss.svg", MetricsLog::read_all(metrics_path), summary.unigram_baseline);
  std::printf("done: %lld steps in %s (%.0f tokens/s, MFU %.1f%%)\n", static_cast<long long>(steps_run),
              format_duration(seconds_since(run_start)).c_str(), summary.tokens_per_s, 100 * summary.mfu);
  return summary;
}

}  // namespace loom
