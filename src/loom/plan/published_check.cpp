// Predicting a published run: the layouts its unstated fields allow, the fastest that fits
// (what the source would have run), and every figure it measured in its own convention.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "loom/core/error.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/published_fields.hpp"
#include "loom/plan/published_runs.hpp"
#include "loom/plan/rank_parameters.hpp"
#include "loom/plan/search.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

namespace {

// How far a stated global batch may be moved to the nearest that dp x micro-batch splits (see
// check_published_run): a round figure's rounding ("2M tokens"), not a different run.
constexpr double kGlobalBatchRounding = 0.05;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int64_t> choices(bool unstated, int64_t stated, const std::vector<int64_t>& otherwise) {
  return unstated ? otherwise : std::vector<int64_t>{stated};
}

// None < selective < full: how much memory a recomputation saves.
int recompute_rank(Recompute r) {
  return r == Recompute::Full ? 2 : r == Recompute::Selective ? 1 : 0;
}

const char* recompute_word(Recompute r) {
  return r == Recompute::Full ? "full" : r == Recompute::Selective ? "selective" : "none";
}

}  // namespace

namespace {

// The largest GPT (Megatron-LM's shapes, gpt_in_megatron_shape) whose memory fits on the run's
// GPU at its layout and the given ZeRO stage, in billions of parameters: memory grows with the
// parameters, so a bisection on the log of the size, to 0.1%. A tp that does not divide a
// shape's heads takes one head per tp rank (the parameters do not change).
double largest_model_that_fits(const PublishedRun& run, int zero_stage, RunCheck& check) {
  PlanLayout l = run.layout;
  l.zero_stage = zero_stage;
  GpuJob memory;
  memory.seq_len = run.seq_len;
  memory.flash_attention = run.flash_attention;
  memory.state = kMixedPrecisionAdam;
  memory.state.gradient = run.gradient_bytes;
  if (zero_stage == 0 && run.conventions.fused_fp32_allreduce_buffer) memory.state.gradient += 4;
  memory.micro_batches = 1;
  PublishedRun scratch = run;
  auto fits = [&](double params) {
    scratch.assumptions.clear();
    ModelConfig m = published_detail::gpt_in_megatron_shape(params, "largest", scratch);
    if (m.n_head % l.tp != 0) m.n_head = m.n_kv_head = l.tp;
    if (m.n_layer < l.pp) return true;  // smaller than any model the layout could hold
    memory.stage_layers = stage_layer_counts(m.n_layer, l.pp);
    return fits_in_hbm(predict_gpu_memory(m, l, memory), run.cluster.gpu.hbm_bytes,
                       run.conventions.megatron);
  };
  double low = 1e8, high = 1e15;
  if (!fits(low)) return 0;
  while (high / low > 1.001) {
    const double mid = std::sqrt(low * high);
    (fits(mid) ? low : high) = mid;
  }
  check.notes.push_back(
      "largest model at ZeRO stage " + std::to_string(zero_stage) +
      ": a GPT in Megatron-LM's shapes (Narayanan et al. 2021, Table 1), micro-batch " +
      std::to_string(l.micro_batch) + ", recompute " + recompute_word(l.recompute) +
      (zero_stage == 0 && run.conventions.fused_fp32_allreduce_buffer
           ? ", every gradient also in a fused fp32 all-reduce buffer (ZeRO paper sec. 3.2)"
           : ""));
  return low / 1e9;
}

RunCheck check_run(const PublishedRun& run) {
  RunCheck check;
  check.run = &run;
  check.layout = run.layout;
  if (!run.refused.empty()) return check;
  check.answered = true;
  if (run.kind == "analytic_memory_reference") {
    for (const Measured& m : run.measured) {
      const double gb = zero_model_states(run.params, kMixedPrecisionAdam, run.layout.dp, run.layout.zero_stage).total() / 1e9;
      check.figures.push_back({m, gb, gb / m.value - 1});
    }
    return check;
  }
  if (!run.measured.empty() && run.measured.front().figure == Figure::LargestModel) {
    for (const Measured& m : run.measured) {
      const double billions = largest_model_that_fits(
          run, m.zero_stage >= 0 ? m.zero_stage : run.layout.zero_stage, check);
      check.figures.push_back({m, billions, billions / m.value - 1});
    }
    return check;
  }

  const ModelConfig& model = run.model;
  TrainingJob job;
  job.seq_len = run.seq_len;
  // A stated global batch that no micro-batch splits evenly over dp (OPT-175B's 1024 sequences
  // on 124 replicas, GPT-NeoX-20B's 1538 on 12; "2M tokens" is a round figure) is run as the
  // nearest that one does, and said, when that moves it by at most 5%; the predicted step time
  // is then scaled back to the stated batch (tokens/s and utilisation do not depend on it). A
  // stated interleaved schedule also needs the micro-batches to fill whole pipeline rounds.
  int64_t global_batch = run.global_batch;
  {
    const std::vector<int64_t> mbs_choices =
        choices(run.unstated.micro_batch, run.layout.micro_batch, {1, 2, 4, 8, 16});
    const int64_t rounds = !run.unstated.vp && run.layout.vp > 1 ? run.layout.pp : 1;
    bool splits = false;
    for (int64_t mbs : mbs_choices)
      splits = splits || global_batch % (run.layout.dp * mbs * rounds) == 0;
    if (!splits && global_batch > 0) {
      const int64_t unit = run.layout.dp * mbs_choices.front() * rounds;
      const int64_t nearest = std::max<int64_t>(1, (global_batch + unit / 2) / unit) * unit;
      const double moved =
          std::fabs(static_cast<double>(nearest) / static_cast<double>(global_batch) - 1);
      if (moved <= kGlobalBatchRounding) {
        global_batch = nearest;
        check.notes.push_back("global batch " + std::to_string(run.global_batch) +
                              " is not a multiple of dp " + std::to_string(run.layout.dp) +
                              " x micro-batch " + std::to_string(mbs_choices.front()) +
                              (rounds > 1 ? " x pp " + std::to_string(rounds) : std::string()) +
                              ": run as " + std::to_string(global_batch) +
                              ", the nearest that is (step time scaled back)");
      }
    }
  }
  job.global_batch = global_batch;
  job.fp8_gemms = run.fp8;
  job.fp4_gemms = run.fp4;
  job.mx_gemms = run.mx;
  job.attention_kernel_speedup = run.attention_kernel_speedup;
  job.tp_comm_overlap = run.tp_comm_overlap;
  // Megatron-LM's asynchronous tp backward, on by default from 2022 (the stacks after sequence
  // parallelism: Korthikanti et al. and later); Narayanan et al. 2021 and the ZeRO paper's 2019
  // Megatron ran without it.
  job.tp_async_backward = run.conventions.megatron && !run.conventions.before_selective_recompute;
  job.dp_sync_after_backward = run.conventions.dp_sync_after_backward;
  job.tp_reduce_per_column_linear = run.conventions.tp_reduce_per_column_linear;
  job.moe_host_s_per_op = run.moe_host_s_per_op;
  job.moe_dispatch_per_rank = run.moe_dispatch_per_rank;
  job.frozen_base = run.frozen_base;
  job.memory.fp8_linear_inputs = run.fp8;
  if (run.deepspeed_zero3) job.zero3_traffic = Zero3Traffic::DeepSpeed;
  job.memory.seq_len = run.seq_len;
  job.memory.flash_attention = run.flash_attention;
  job.memory.unfused_rmsnorm = run.unfused_rmsnorm;
  job.memory.unfused_softmax = run.unfused_softmax;
  job.memory.state = kMixedPrecisionAdam;
  job.memory.state.gradient = run.gradient_bytes;
  job.memory.state.master = run.master_bytes;
  job.memory.state.moments = run.moment_bytes;
  if (run.frozen_base) job.memory.state = frozen_base_state(job.memory.state);
  job.memory.logits_bytes_per_element = run.conventions.logits_bytes_per_element;
  job.memory.logits_gathered_over_tp = run.conventions.logits_gathered_over_tp;
  job.memory.logits_bytes_per_element_under_tp = run.conventions.logits_bytes_under_tp;
  job.memory.selective = run.selective;
  job.memory.op_sac_eager = run.op_sac_eager;
  job.memory.cp_gathers_repeated_kv = run.conventions.cp_allgather_repeated_kv;
  job.memory.full_recompute_share = run.full_recompute_share;
  job.memory.fsdp_gathered_under_pp = run.conventions.fsdp_gathered_under_pp;
  // Megatron-LM's GPT layers keep dropout masks: count them as Korthikanti et al. do.
  if (run.conventions.megatron && model.arch == Architecture::GPT2) job.memory.accounting = ActivationAccounting::Korthikanti;

  bool have = false;
  int64_t best_offload = 0;
  std::vector<int64_t> best_stage_layers;
  // Megatron FSDP on a Grace-Blackwell system under a source whose recipes offload activations
  // there, with its recomputation unstated.
  const std::string& gpu_name = run.cluster.gpu.name;
  const bool offload_allowed = run.conventions.grace_activation_offload && run.unstated.recompute &&
                               run.layout.zero_stage == 3 &&
                               (gpu_name.rfind("gb200", 0) == 0 || gpu_name.rfind("gb300", 0) == 0);
  StepTime best_time;
  MemoryBreakdown best_memory;
  std::string best_split_note;
  // Selective recomputation where the source's stacks had it (Korthikanti et al., May 2022).
  const std::vector<Recompute> recomputes =
      !run.unstated.recompute ? std::vector<Recompute>{run.layout.recompute}
      : run.conventions.before_selective_recompute
          ? std::vector<Recompute>{Recompute::None, Recompute::Full}
          : std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full};
  // An unstated ep on a mixture of experts: every power of two that divides the experts and
  // dp x cp (the ranks experts are spread over).
  std::vector<int64_t> eps = {run.layout.ep};
  if (run.unstated.ep && model.is_moe()) {
    eps.clear();
    for (int64_t ep = 1; ep <= model.n_experts && ep <= run.layout.dp * run.layout.cp; ep *= 2)
      if (model.n_experts % ep == 0 && (run.layout.dp * run.layout.cp) % ep == 0) eps.push_back(ep);
  }
  const std::vector<int64_t> zeros = choices(run.unstated.zero, run.layout.zero_stage, {0, 1});
  // An unstated tp (and dp): a power of two within a node (16 on a DGX-2), dividing the GPUs
  // and the heads.
  std::vector<int64_t> tps = {run.layout.tp};
  if (run.unstated.tp) {
    tps.clear();
    const int64_t gpus = run.layout.gpus();
    for (int64_t tp : {1, 2, 4, 8, 16})
      if (tp <= run.cluster.gpus_per_node && gpus % (tp * run.layout.pp * run.layout.cp) == 0 &&
          model.n_head % tp == 0 && model.n_kv_head % tp == 0)
        tps.push_back(tp);
  }
  for (int64_t mbs : choices(run.unstated.micro_batch, run.layout.micro_batch, {1, 2, 4, 8, 16})) {
    std::vector<int64_t> vps = run.unstated.interleaved ? std::vector<int64_t>{2, 3, 4, 5, 6, 8}
                                                        : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 8};
    // Megatron's --num-layers-per-virtual-pipeline-stage takes any divisor of a stage's layers.
    // Where none of 2-8 chunks splits them (7 a stage: 112 layers on pp 16; 23: 92 on pp 4), the
    // stage's own layer count is searched too: 7 or 23 chunks of one layer.
    if (run.unstated.vp && run.layout.pp > 1 && model.n_layer % run.layout.pp == 0) {
      const int64_t per_stage = model.n_layer / run.layout.pp;
      bool splits = false;
      for (int64_t v : {2, 3, 4, 5, 6, 8}) splits = splits || per_stage % v == 0;
      if (!splits && per_stage > 1) vps.push_back(per_stage);
    }
    for (int64_t vp : choices(run.unstated.vp, run.layout.vp, vps)) {
      for (Recompute recompute : recomputes) for (int64_t ep : eps) for (int64_t zero : zeros) for (int64_t tp : tps) {
        PlanLayout l = run.layout;
        if (tp != l.tp) {
          l.dp = l.gpus() / (tp * l.pp * l.cp);
          l.tp = tp;
          if (run.unstated.sp_follows_tp) l.sequence_parallel = tp > 1;
        }
        if (ep > 1 && (l.dp * l.cp) % ep != 0) continue;
        l.ep = ep;
        // An unstated stage has nothing to shard on one data-parallel rank.
        l.zero_stage = run.unstated.zero && l.dp * l.cp == 1 ? 0 : static_cast<int>(zero);
        l.micro_batch = mbs;
        l.vp = vp;
        l.recompute = recompute;
        l.schedule = run.named_schedule ? *run.named_schedule
                                        : vp > 1 ? PipelineSchedule::Interleaved
                                                 : PipelineSchedule::OneFOneB;
        const int64_t stages = l.pp * vp;
        // Up to one layer a stage; Llama 3's split (sec. 3.3.2) also leaves the first and last
        // stage with the embedding and the head alone: n_layer + 2 one-layer stages.
        if (global_batch % (l.dp * mbs) != 0 ||
            (stages > model.n_layer && stages != model.n_layer + 2))
          continue;
        // An unstated interleaving is one the stack could run: an even split, or Llama 3's.
        if (run.unstated.vp && vp > 1 && model.n_layer % stages != 0 && (model.n_layer + 2) % stages != 0) continue;
        const int64_t micro = global_batch / (l.dp * mbs);
        // Interleaving takes micro-batches in groups of pp; the V schedules at least 2 pp.
        if (l.schedule == PipelineSchedule::Interleaved && micro % l.pp != 0) continue;
        if (vp > 1 && l.schedule != PipelineSchedule::Interleaved && micro < 2 * l.pp) continue;
        std::string split_note;
        job.memory.stage_layers = balanced_stage_layers(model, stages, job.seq_len, &split_note);
        job.memory.micro_batches = micro;
        job.memory.offloaded_layers = 0;
        MemoryBreakdown memory = predict_gpu_memory(model, l, job.memory);
        bool fits = fits_in_hbm(memory, run.cluster.gpu.hbm_bytes, run.conventions.megatron);
        // The source's Grace recipes (SourceConventions::grace_activation_offload): where no
        // recomputation does not fit, the fewest offloaded layers that do.
        if (!fits && offload_allowed && recompute == Recompute::None && l.pp == 1 && l.vp == 1) {
          // The Grace CPU's memory holds what leaves the GPU.
          const double host = host_memory_bytes_per_gpu(run.cluster.gpu);
          for (int64_t k = 1; k < model.n_layer && !fits; ++k) {
            job.memory.offloaded_layers = k;
            if (offloaded_host_bytes(model, l, job.memory) > host) break;
            memory = predict_gpu_memory(model, l, job.memory);
            fits = fits_in_hbm(memory, run.cluster.gpu.hbm_bytes, run.conventions.megatron);
          }
          if (!fits) {
            job.memory.offloaded_layers = 0;
            memory = predict_gpu_memory(model, l, job.memory);
          }
        }
        const StepTime t = predict_step_time(model, l, run.cluster, job);
        // Prefer layouts that fit; among equals, the faster one (what the source would have run).
        // Where none fits the planner's memory, the run still ran: the fastest of them (Llama 3's
        // 8,192-GPU stage with one-layer chunks, its sec. 3.3.2, not the least-memory V = 2
        // taken until session 20, whose bubble made it 14% slow).
        // Of an unstated recomputation where none fits, the most: the run ran, so it saved what
        // memory it could (Narayanan et al. 2021's ZeRO-3 530B on 640 GPUs, whose eq. 3 counts
        // the recomputed forward); then the fastest.
        const bool by_recompute =
            have && !fits && !check.fits && recompute != check.layout.recompute;
        const bool better =
            !have || (fits && !check.fits) ||
            (fits == check.fits &&
             (by_recompute ? recompute_rank(recompute) > recompute_rank(check.layout.recompute)
                           : t.total_s < best_time.total_s));
        if (!better) continue;
        have = true;
        check.layout = l;
        check.fits = fits;
        best_offload = job.memory.offloaded_layers;
        best_stage_layers = job.memory.stage_layers;
        best_time = t;
        best_memory = memory;
        best_split_note = split_note;
      }
    }
  }
  if (!have) {
    check.answered = false;
    check.picks.push_back("no micro-batch size splits global batch " +
                          std::to_string(global_batch) +
                          " over dp = " + std::to_string(run.layout.dp) +
                          (global_batch != run.global_batch
                               ? " (the stated " + std::to_string(run.global_batch) + ", rounded)"
                               : std::string()));
    return check;
  }
  const PlanLayout& l = check.layout;
  // The chosen layout's own split and offloading (the loop left the last candidate's).
  job.memory.stage_layers = best_stage_layers;
  job.memory.offloaded_layers = best_offload;
  if (run.unstated.micro_batch) check.picks.push_back("micro-batch " + std::to_string(l.micro_batch));
  if (eps.size() > 1) check.picks.push_back("ep " + std::to_string(l.ep) + " (not stated)");
  if (run.unstated.vp)
    check.picks.push_back(
        "vp " + std::to_string(l.vp) +
        (run.unstated.interleaved && !check.fits
             ? (run.unstated.recompute ? " (none fits: the fastest of the most recomputation)"
                                       : " (none fits: the fastest)")
             : ""));
  if (run.unstated.recompute)
    check.picks.push_back(
        std::string("recompute ") + recompute_word(l.recompute) +
        (run.conventions.before_selective_recompute
             ? " (of none and full: selective recomputation appeared in 2022)"
             : "") +
        (check.fits ? "" : " (none fits: the most recomputation, then the fastest)"));
  if (run.unstated.zero) check.picks.push_back("ZeRO stage " + std::to_string(l.zero_stage) + " (not stated)");
  if (run.unstated.tp)
    check.picks.push_back("tp " + std::to_string(l.tp) + ", dp " + std::to_string(l.dp) + " (not stated)");
  if (!best_split_note.empty()) check.picks.push_back(best_split_note);
  if (best_offload > 0)
    check.picks.push_back("activations of " + std::to_string(best_offload) + " of " +
                          std::to_string(model.n_layer) +
                          " layers offloaded to the Grace CPU's memory, not recomputed (the "
                          "source's Grace recipes: cpu_offloading_num_layers), over NVLink-C2C");
  if (l.tp > 1 && job.tp_comm_overlap)
    check.picks.push_back(
        "tp communication pipelined against its GEMMs (the source's recipes set tp_comm_overlap)");

  const double gpus = static_cast<double>(l.gpus());
  check.step_s = best_time.total_s;
  check.tokens_per_s_per_gpu =
      static_cast<double>(global_batch * run.seq_len) / best_time.total_s / gpus;
  check.allocated_gib = (best_memory.total() - best_memory.workspace) / kGiB;
  // What PyTorch's caching allocator reserves: the allocated peak plus what it cannot reuse,
  // the same allowance the fit test leaves (kUsableMemoryFraction); CUDA context, NCCL and
  // cuBLAS workspaces (GpuJob::workspace_bytes) lie outside it.
  check.reserved_gib = check.allocated_gib / kUsableMemoryFraction;
  const double n = run.params > 0 && !run.conventions.mfu_counts_model_params
                       ? run.params
                       : static_cast<double>(model.parameter_count());
  if (run.params > 0 && run.conventions.mfu_counts_model_params &&
      std::fabs(n / run.params - 1) > 0.01) {
    char note[160];
    std::snprintf(note, sizeof note,
                  "MFU counts the model's own N, %.4g B, not params_b %.4g B (the source's "
                  "convention)",
                  n / 1e9, run.params / 1e9);
    check.notes.push_back(note);
  }
  // MosaicML's FP8 rows divide by the FP8 peak (llm-foundry's benchmark tables: the FP8 MFU of a
  // row is half what its tokens/s give over the BF16 peak).
  const double peak = (run.fp8 && (run.conventions.fp8_mfu_over_fp8_peak || run.stated_fp8_peak)
                           ? std::max(run.cluster.gpu.bf16_tflops, run.cluster.gpu.fp8_tflops)
                           : run.cluster.gpu.bf16_tflops) *
                      1e12;
  const double s = static_cast<double>(run.seq_len);
  // A LoRA run's model FLOPs count the forward and the input gradients, 4 a parameter of the
  // blocks and the head (the input embedding not counted): NeMo 24.07's Llama 2 7B, 663 TFLOP/s
  // over 24,824 tokens/s = 26.7 GFLOP a token, 4 x 6.61B = 26.4; Megatron-Bridge 26.06's Llama 3
  // 70B, 735 / 2643 = 278.1, 4 x 69.5B = 278.0: the Megatron stacks count no attention there.
  // Automodel's Llama 3 70B, 316 / 1091.85 = 289.4: 4 x 69.5B + 4Lhs (causal) = 288.7.
  auto per_token = [&](FlopCount count) {
    if (!run.frozen_base) return flops_per_token(count, model, n, s, l.recompute);
    const double causal = flops_per_token(FlopCount::NonEmbeddingCausal, model, n, s, l.recompute);
    const double attention =
        flops_per_token(FlopCount::NonEmbeddingFull, model, n, s, l.recompute) - causal;  // 6Lhs
    return 4.0 / 6.0 * (run.conventions.megatron ? causal - attention : causal);
  };
  // A run that states both its model TFLOP/s and its tokens/s per GPU states its own FLOPs per
  // token, their ratio. Where the convention's formula counts more than 2% away from it (a
  // source that counted a model its own way: Megatron-Bridge's 25.11 gpt-oss rows against its
  // later flop_utils), the TFLOP/s is predicted through the run's own count, and that is said.
  double tflops_per_token = per_token(run.conventions.tflops);
  {
    double tflops = 0, tokens = 0;
    for (const Measured& m : run.measured) {
      if (m.figure == Figure::TflopsPerGpu) tflops = m.value;
      if (m.figure == Figure::TokensPerSecond) tokens = m.value;
    }
    const double stated = tflops > 0 && tokens > 0 ? tflops * 1e12 / tokens : 0;
    if (stated > 0 && std::fabs(stated / tflops_per_token - 1) > 0.02) {
      char note[200];
      std::snprintf(note, sizeof note,
                    "TFLOP/s through the run's own %.4g GFLOP per token (its TFLOP/s over its "
                    "tokens/s), %+.1f%% from "
                    "the convention's %.4g",
                    stated / 1e9, 100 * (tflops_per_token / stated - 1), tflops_per_token / 1e9);
      check.notes.push_back(note);
      tflops_per_token = stated;
    }
  }
  // Model states "by formula" (Korthikanti et al.'s Fig. 1) count the GPU's transformer layers,
  // 18 bytes a parameter of 12 h^2 / t a layer, not the embedding or the head its stage also
  // holds: by hand their 22B on tp 8 gives 48 x 12 x 6144^2 / 8 x 18 B = 45.56 GiB and their 530B
  // on tp 8, pp 35 x 3 chunks 3 x 12 x 20480^2 / 8 x 18 B = 31.64 GiB, the figure's bars.
  double states_gib =
      (best_memory.parameters + best_memory.gradients + best_memory.optimizer_state) / kGiB;
  if (run.conventions.memory == MemoryCount::StatesAndActivations) {
    const RankParameters first = rank_parameters(model, l, 0, job.memory.stage_layers);
    if (first.total() > 0) states_gib *= (first.block + first.experts) / first.total();
  }
  for (const Measured& m : run.measured) {
    double predicted = 0;
    switch (m.figure) {
      case Figure::Mfu: predicted = check.tokens_per_s_per_gpu * per_token(run.conventions.mfu) / peak; break;
      case Figure::Hfu: predicted = check.tokens_per_s_per_gpu * per_token(run.conventions.hfu) / peak; break;
      case Figure::TflopsPerGpu:
        predicted = check.tokens_per_s_per_gpu * tflops_per_token / 1e12;
        break;
      case Figure::TokensPerSecond: predicted = check.tokens_per_s_per_gpu; break;
      case Figure::StepTime:  // for the stated batch
        predicted = check.step_s * static_cast<double>(run.global_batch) /
                    static_cast<double>(global_batch);
        break;
      case Figure::MemoryPerGpu:
        predicted = run.conventions.memory == MemoryCount::Reserved
                        ? check.reserved_gib
                        : states_gib + best_memory.activations / kGiB;
        break;
      case Figure::ModelStates:
        predicted = (best_memory.parameters + best_memory.gradients + best_memory.optimizer_state) / 1e9;
        break;
      case Figure::Fits: predicted = check.fits ? 1 : 0; break;
      case Figure::LayerForwardMs: predicted = 1e3 * predict_layer_time(model, l, run.cluster, job).forward_s; break;
      case Figure::LayerBackwardMs: predicted = 1e3 * predict_layer_time(model, l, run.cluster, job).backward_s; break;
      case Figure::LargestModel: break;  // answered above, for records that measure only it
      case Figure::StatesPerGpu: predicted = states_gib; break;
      case Figure::ActivationsPerGpu: predicted = best_memory.activations / kGiB; break;
      case Figure::AggregatePflops:
        predicted = check.tokens_per_s_per_gpu * tflops_per_token * gpus / 1e15;
        break;
      case Figure::LayerFwdBwdMs: {
        const LayerTime t = predict_layer_time(model, l, run.cluster, job);
        predicted = 1e3 * (t.forward_s + t.backward_s);
        break;
      }
    }
    const double error = m.figure == Figure::Fits ? (predicted == m.value ? 0.0 : 1.0) : predicted / m.value - 1;
    check.figures.push_back({m, predicted, error});
  }
  return check;
}

}  // namespace

// A run whose layout the models refuse (a loom::Error from deep inside: a shape no stage split
// holds, a collective on no ranks) is not answered, with the reason; the others go on.
RunCheck check_published_run(const PublishedRun& run) {
  try {
    return check_run(run);
  } catch (const Error& e) {
    RunCheck check;
    check.run = &run;
    check.layout = run.layout;
    check.answered = false;
    check.picks.push_back(std::string("not predicted: ") + e.what());
    return check;
  }
}

ErrorStats error_stats(std::vector<double> e) {
  ErrorStats s;
  s.count = static_cast<int64_t>(e.size());
  if (e.empty()) return s;
  std::sort(e.begin(), e.end());
  const size_t n = e.size();
  s.median = n % 2 == 1 ? e[n / 2] : (e[n / 2 - 1] + e[n / 2]) / 2;
  // Nearest rank: the smallest value with at least 90% of the values at or below it.
  s.p90 = e[static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n))) - 1];
  s.worst = e.back();
  return s;
}

ValidationSummary summarize(const std::vector<RunCheck>& checks) {
  ValidationSummary s;
  std::vector<double> rates, memory;
  std::map<Figure, std::vector<double>> by_figure;
  std::vector<std::string> order;
  std::map<std::string, SourceCoverage> sources;
  std::map<std::string, std::vector<double>> source_rates;
  for (const RunCheck& c : checks) {
    const std::string& label = c.run->source_label.empty() ? std::string("unreadable") : c.run->source_label;
    if (sources.find(label) == sources.end()) order.push_back(label);
    SourceCoverage& src = sources[label];
    src.label = label;
    ++s.runs;
    ++src.runs;
    s.malformed += c.run->malformed;
    if (!c.answered) continue;
    ++s.answered;
    ++src.answered;
    bool headline = false;
    for (const FigureCheck& f : c.figures) {
      const double e = std::fabs(f.relative_error);
      by_figure[f.measured.figure].push_back(e);
      switch (figure_class(f.measured.figure)) {
        case FigureClass::Rate:
          if (!headline) {
            rates.push_back(e);
            source_rates[label].push_back(e);
            headline = true;
          }
          break;
        case FigureClass::Memory: memory.push_back(e); break;
        case FigureClass::Verdict:
          ++s.verdicts;
          s.verdicts_right += f.relative_error == 0;
          break;
      }
    }
  }
  s.rates = error_stats(rates);
  s.memory = error_stats(memory);
  for (const auto& [figure, errors] : by_figure) s.by_figure.emplace_back(figure_name(figure), error_stats(errors));
  for (const std::string& label : order) {
    SourceCoverage src = sources[label];
    src.rates = error_stats(source_rates[label]);
    s.by_source.push_back(src);
  }
  return s;
}

}  // namespace loom::plan
