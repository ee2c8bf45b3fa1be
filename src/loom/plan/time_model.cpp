#include "loom/plan/time_model.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/model/flops.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/host_issue.hpp"
#include "loom/plan/layer_cost.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/rank_parameters.hpp"

namespace loom::plan {

double moe_imbalance_of(const ModelConfig& m, const TrainingJob& job) {
  if (!(job.moe_imbalance >= 1) || !std::isfinite(job.moe_imbalance))
    throw_error("moe_imbalance = ", job.moe_imbalance,
                "; expected a finite number >= 1 (the busiest expert-parallel rank's rows over the mean)");
  return m.moe_capacity_factor > 0 ? std::min(job.moe_imbalance, std::max(1.0, m.moe_capacity_factor))
                                   : job.moe_imbalance;
}

double expert_groups_hit(const ModelConfig& m, int64_t groups) {
  const double k = static_cast<double>(m.experts_per_token);
  if (groups <= 1) return std::min(k, static_cast<double>(std::max<int64_t>(groups, 0)));
  if (m.n_experts % groups != 0) return std::min(k, static_cast<double>(groups));
  // The chance that none of a token's k experts (drawn without replacement from E) lies in a
  // given group of E/groups: C(E - E/groups, k) / C(E, k), a product of k ratios.
  const int64_t experts = m.n_experts, per_group = m.n_experts / groups;
  double missed = 1;
  for (int64_t i = 0; i < m.experts_per_token && missed > 0; ++i)
    missed *= std::max(0.0, static_cast<double>(experts - per_group - i)) /
              static_cast<double>(experts - i);
  return std::min(k, static_cast<double>(groups) * (1 - missed));
}

double moe_dispatch_copies(const ModelConfig& m, int64_t ep, const TrainingJob& job) {
  const double k = static_cast<double>(m.experts_per_token);
  return job.moe_dispatch_per_rank && ep > 1 ? expert_groups_hit(m, ep) : k;
}

namespace {
// A layer's passes: compute plus what they wait for (the tp and cp collectives' exposed part,
// the expert all-to-alls), or the host's issue of the layer's operations where longer
// (host_issue.hpp); and what DualPipeV's other pass can hide of each: the waits, not the issue.
struct LayerPasses {
  double forward_s, backward_s, hidable_forward_s, hidable_backward_s;
};
LayerPasses layer_passes(const LayerCost& c, const ModelConfig& m, const PlanLayout& l,
                         const TrainingJob& job) {
  const double wait_f =
      c.tp_exposed_forward_s + c.ep_comm_s / 2 + c.cp_exposed_forward_s + c.fp8_reduce_forward_s;
  const double wait_b =
      c.tp_exposed_backward_s + c.ep_comm_s / 2 + c.cp_exposed_backward_s + c.fp8_reduce_backward_s;
  const double host_f = job.moe_host_s_per_op * moe_host_forward_ops(m, l);
  const double host_b = moe_host_backward_over_forward(l, job) * host_f;
  const double f = std::max(c.forward_s + wait_f, host_f),
               b = std::max(c.backward_s + wait_b, host_b);
  return {f, b, f - std::max(c.forward_s, host_f), b - std::max(c.backward_s, host_b)};
}
}  // namespace

LayerTime predict_layer_time(const ModelConfig& m, const PlanLayout& l, const ClusterSpec& cluster, const TrainingJob& job) {
  const LayerCost c = layer_cost(m, l, cluster, job, job.gemm.value_or(default_gemm_efficiency(cluster.gpu)));
  const LayerPasses p = layer_passes(c, m, l, job);
  return {p.forward_s, p.backward_s};
}

StepTime predict_step_time(const ModelConfig& m, const PlanLayout& l, const ClusterSpec& cluster, const TrainingJob& job,
                           bool simulate) {
  const int64_t per_micro = l.dp * l.micro_batch;
  if (job.global_batch % per_micro != 0)
    throw_error("global batch ", job.global_batch, " sequences is not a multiple of dp x mbs = ", per_micro);
  StepTime out;
  out.micro_batches = job.global_batch / per_micro;
  const int64_t micro = out.micro_batches;
  const GpuSpec& gpu = cluster.gpu;
  const GemmEfficiency gemm = job.gemm.value_or(default_gemm_efficiency(gpu));
  const LayerCost layer = layer_cost(m, l, cluster, job, gemm);
  const int64_t stages = l.pp * l.vp;
  const std::vector<int64_t> stage_layers = planner_stage_layers(m, l, job.memory);

  // The output projection and loss (2 x tokens x h x V / tp forward, twice that backward) run
  // on the last stage (Narayanan et al. 2021 sec. 2.2: the first stage holds the embedding, the
  // last the head); they run in BF16 under FP8 recipes too (Transformer Engine keeps the head
  // in higher precision).
  const double tokens = static_cast<double>(l.micro_batch * job.seq_len / l.cp);
  const double head_gemm = 2 * tokens * static_cast<double>(m.n_embd) *
                           static_cast<double>(m.vocab_size) / static_cast<double>(l.tp) /
                           (gpu.bf16_tflops * 1e12 *
                            gemm.efficiency(tokens, static_cast<double>(m.vocab_size / l.tp),
                                            static_cast<double>(m.n_embd)));
  // loom's CUDA engine's fused loss also streams the logits: its log-sum-exp pass reads each
  // once forward, its softmax gradient reads it again and writes the gradient backward; f32
  // logits with a bf16 gradient (4 and 6 bytes), bf16 ones under bf16 activations, their
  // gradient written over them (2 and 4), where one rank holds the vocabulary (the shard passes
  // keep f32) (kernels/cuda/cross_entropy.cu).
  const double logits = tokens * static_cast<double>(m.vocab_size) / static_cast<double>(l.tp);
  const bool loom_cuda = job.memory.loom_cuda_device_memory > 0;
  const double stream_rate = streaming_rate(job, gpu.hbm_bandwidth_bytes_per_s);
  // With the vocabulary in several chunks the backward computes each chunk's logits again (one
  // chunk's stay from the forward): a third product.
  const bool head_recomputed =
      loom_cuda && loom_cuda_vocab_chunk(m, l, job.seq_len, job.memory.loom_cuda_device_memory,
                                         job.memory.activation_bytes) < m.vocab_size;
  const bool half_logits = job.memory.activation_bytes < 4 && l.tp == 1;
  double head_fwd = head_gemm + (loom_cuda ? (half_logits ? 2 : 4) * logits / stream_rate : 0);
  // A frozen base (TrainingJob::frozen_base) drops the head's weight-gradient product.
  const double head_weight_grad = job.frozen_base ? 0.0 : head_gemm;
  double head_bwd = (head_recomputed ? 2 : 1) * head_gemm + head_weight_grad +
                    (loom_cuda ? (half_logits ? 4 : 6) * logits / stream_rate : 0);
  if (job.memory.logits_gathered_over_tp) {
    // Aleph-Alpha/scaling's head (GpuJob::logits_gathered_over_tp): the ranks' logits are
    // all-gathered (lm_head.py, parallel_output False), then every rank runs the loss over the
    // whole vocabulary in fp32 (losses/cross_entropy.py on output.activations.float()), passes
    // over tokens x V in HBM: forward the fp32 copy (read 2, write 4) and log_softmax (its max
    // and sum read 4 each, its output written 4), 18 bytes a logit; backward nll_loss's gradient
    // (written 4), log_softmax's (reads the gradient twice and the output once, writes 4) and
    // the cast back to bf16 (read 4, write 2), 26.
    const double whole = tokens * static_cast<double>(m.vocab_size);
    const double gather_s =
        l.tp > 1 ? collective_time(Collective::AllGather, whole * job.memory.activation_bytes,
                                   group_topology(cluster, l.tp, 1))
                       .seconds
                 : 0.0;
    head_fwd += gather_s + 18 * whole / gpu.hbm_bandwidth_bytes_per_s;
    head_bwd += 26 * whole / gpu.hbm_bandwidth_bytes_per_s;
  }
  // Multi-token prediction (ModelConfig::mtp_layers): each depth one more attention and MLP on
  // the last stage, charged as two of the hybrid's mean blocks (a transformer's one layer), and
  // one more pass of the head. Its weights and activations are in the memory model
  // (rank_parameters counts a depth as the last stage's one more layer, two blocks in a hybrid).
  const double mtp_layers = static_cast<double>(m.mtp_layers * (m.is_hybrid() ? 2 : 1));
  head_fwd *= 1 + static_cast<double>(m.mtp_layers);
  head_bwd *= 1 + static_cast<double>(m.mtp_layers);
  const LayerPasses passes = layer_passes(layer, m, l, job);
  // Each stage's passes: its layers, plus the head on the last. The simulation takes each
  // stage's own; the closed forms (ranking layouts quickly) pace uniform chunks: with one chunk
  // per rank the slowest stage's, with several the busiest rank's mean chunk (a rank with the
  // head spreads it over its v chunks). The critical rank's own work is the most any pp rank
  // does over its v chunks.
  double t_f = 0, t_b = 0, t_w = 0, compute_per_micro = 0, layers_per_rank = 0, busy_per_micro = 0;
  std::vector<PassTimes> stage_passes;
  for (int64_t stage = 0; stage < stages; ++stage) {
    const bool last = stage == stages - 1;
    const double n =
        static_cast<double>(stage_layers[static_cast<size_t>(stage)]) + (last ? mtp_layers : 0);
    const double f = n * passes.forward_s + (last ? head_fwd : 0),
                 b = n * passes.backward_s + (last ? head_bwd : 0);
    const double w = std::min(
        n * layer.weight_grad_s + (last ? head_weight_grad * (1 + static_cast<double>(m.mtp_layers)) : 0),
        b / 2);  // B is never shorter than W
    // The collectives each pass waits for (hidable under DualPipeV's other pass).
    stage_passes.push_back({f, b - w, w, n * passes.hidable_forward_s,
                            std::min(n * passes.hidable_backward_s, b - w)});
    t_f = std::max(t_f, f);
    t_b = std::max(t_b, b);
    t_w = std::max(t_w, w);
  }
  t_w = std::min(t_w, t_b / 2);  // the slowest stage's B is never shorter than its W
  double mean_f = 0, mean_b = 0, mean_w = 0;
  for (int64_t rank = 0; rank < l.pp; ++rank) {
    double work = 0, layers = 0, f = 0, b = 0, w = 0;
    for (int64_t chunk = 0; chunk < l.vp; ++chunk) {
      const int64_t stage = stage_of(chunk, rank, l.pp, stage_placement(l.schedule));
      const bool last = stage == stages - 1;
      const double n =
          static_cast<double>(stage_layers[static_cast<size_t>(stage)]) + (last ? mtp_layers : 0);
      work += n * (layer.forward_s + layer.backward_s) + (last ? head_fwd + head_bwd : 0);
      layers += n;
      const PassTimes& passes = stage_passes[static_cast<size_t>(stage)];
      f += passes.forward_s;
      b += passes.backward_s();
      w += n * layer.weight_grad_s +
           (last ? head_weight_grad * (1 + static_cast<double>(m.mtp_layers)) : 0);
    }
    if (f + b > mean_f + mean_b) mean_f = f, mean_b = b, mean_w = w;
    compute_per_micro = std::max(compute_per_micro, work);
    layers_per_rank = std::max(layers_per_rank, layers);
    busy_per_micro = std::max(busy_per_micro, f + b);
  }
  if (l.vp > 1) {
    const double v = static_cast<double>(l.vp);
    t_f = mean_f / v, t_b = mean_b / v, t_w = std::min(mean_w / v, t_b / 2);
  }
  // loom's engine on a CPU with fewer cores than ranks: processes share the cores, each at
  // cores / ranks of its full speed while all are busy (times above are at full speed).
  const bool shared_cores = cluster.cores > 0 && l.gpus() > cluster.cores;
  const double sharing = shared_cores ? static_cast<double>(l.gpus()) / static_cast<double>(cluster.cores) : 1.0;

  out.chunk_forward_s = t_f;
  out.chunk_backward_s = t_b;
  // Pipeline: simulate the schedule's own per-rank action lists.
  // Without one, every rank is busy throughout: compute at the shared pace, tp and cp traffic
  // (measured with every rank running) as it is.
  double makespan = static_cast<double>(micro) * (busy_per_micro + compute_per_micro * (sharing - 1));
  if (l.pp > 1) {
    const double act_bytes = tokens * static_cast<double>(m.n_embd) * job.memory.activation_bytes / static_cast<double>(l.tp);
    const int64_t pp_stride = l.dp * l.cp * l.ep * l.tp;
    const Link link = pp_stride < cluster.gpus_per_node ? nvlink_of(cluster) : network_of(cluster);
    const double p2p = p2p_time(act_bytes, link);
    out.p2p_s = p2p;
    out.pp_comm_s = 2 * p2p * static_cast<double>(micro * l.vp);
    const double closed_form =
        l.schedule == PipelineSchedule::ZeroBubbleH1
            // m (F + B + W) + (p - 1)(F + B - W), B the input-gradient part (Qi et al. 2023, sec 3.1)
            ? static_cast<double>(micro) * (t_f + t_b) +
                  static_cast<double>(l.pp - 1) * (t_f + t_b - 2 * t_w + 2 * p2p)
        : stage_placement(l.schedule) == StagePlacement::V
            // 2m (F + B + W) + (p - 1)(F + p2p): only the last rank's wait for the first
            // activation down the V, exact when F = B = W (tests/test_pipeline_zbv.cpp)
            ? static_cast<double>(2 * micro) * (t_f + t_b) + static_cast<double>(l.pp - 1) * (t_f + p2p)
            : static_cast<double>(micro * l.vp + l.pp - 1) * (t_f + t_b + 2 * p2p);
    // Past kMaxSimulatedChunks chunks per rank the bubble is a rounding error of the step and
    // the action lists would not fit in memory: the closed form stands in.
    constexpr int64_t kMaxSimulatedChunks = 1 << 16;
    const bool simulate_here = simulate && micro * l.vp <= kMaxSimulatedChunks;
    const std::vector<std::vector<PipeAction>> actions =
        simulate_here ? pipeline_actions(l.schedule, l.pp, micro, l.vp) : std::vector<std::vector<PipeAction>>{};
    if (!simulate_here) {
      makespan = closed_form * sharing;
    } else if (shared_cores) {
      makespan = simulate_pipeline_on_shared_cores(actions, l.pp, l.vp, stage_passes, p2p, stage_placement(l.schedule),
                                                   static_cast<double>(cluster.cores), l.gpus() / l.pp)
                     .makespan;
    } else {
      // DualPipeV's pairs overlap on GPUs (DeepSeek-V3 sec. 3.2.1), not on loom's CPU engine.
      makespan =
          simulate_pipeline(actions, l.pp, l.vp, stage_passes, p2p, stage_placement(l.schedule),
                            l.schedule == PipelineSchedule::DualPipeV && cluster.cores == 0)
              .makespan;
    }
  }
  // The critical rank's own passes; on shared cores a pipeline rank idle in the bubble lends
  // its core to the busy ones, so the bubble can be smaller than the sharing suggests (>= 0).
  const double busy = std::min(makespan, static_cast<double>(micro) * (busy_per_micro + compute_per_micro * (sharing - 1)));
  out.bubble_s = makespan - busy;
  out.compute_s = std::min(busy, static_cast<double>(micro) * compute_per_micro * sharing);
  out.tp_comm_s = static_cast<double>(micro) * layers_per_rank * layer.tp_comm_s;
  out.cp_comm_s = static_cast<double>(micro) * layers_per_rank * layer.cp_comm_s;
  out.ep_comm_s = static_cast<double>(micro) * layers_per_rank * layer.ep_comm_s;
  double exposed = busy - out.compute_s;  // tp and the unhidden part of cp, inside the pipeline

  // Data parallelism over dp x cp ranks (both hold replicas of this rank's parameters); expert
  // weights are replicated only over the dp x cp / ep ranks holding the same experts. The
  // pipeline rank holding the most parameters reduces and updates the longest.
  const RankParameters held = heaviest_rank_parameters(m, l, stage_layers, job.experts_whole_on_tp);
  const double params_per_rank = held.dense(), experts_per_rank = held.experts;
  const int64_t replicas = l.dp * l.cp, expert_replicas = replicas / l.ep;
  const GroupTopology dp_group = group_topology(cluster, replicas, l.tp);
  const GroupTopology expert_group = group_topology(cluster, expert_replicas, l.tp * l.ep);
  // One collective over each set of replicas: the dense weights and the experts.
  auto both = [&](Collective op, double dense_elements, double expert_elements, double bytes_per_element) {
    return collective_time(op, dense_elements * bytes_per_element, dp_group).seconds +
           collective_time(op, expert_elements * bytes_per_element, expert_group).seconds;
  };
  if (replicas > 1 && job.frozen_base && l.zero_stage <= 2) {
    // A frozen base reduces no gradient and updates nothing (ZeRO-3 still gathers it, below).
  } else if (replicas > 1) {
    const double grad = job.memory.state.gradient, param = job.memory.state.parameter;
    const double last_backward = static_cast<double>(l.vp) * t_b;  // what the last bucket's reduction hides behind
    if (job.dp_sync_after_backward && l.zero_stage <= 2) {
      out.dp_comm_s =
          both(Collective::AllReduce, params_per_rank, experts_per_rank, 4) +
          (l.zero_stage >= 1 ? both(Collective::AllGather, params_per_rank, experts_per_rank, param)
                             : 0);
      exposed += out.dp_comm_s;
    } else if (l.zero_stage == 0) {
      out.dp_comm_s = both(Collective::AllReduce, params_per_rank, experts_per_rank, grad);
      exposed += std::max(0.0, out.dp_comm_s - last_backward);
    } else if (l.zero_stage <= 2) {
      // Reduce-scatter gradients (stage 2: every micro-batch, to keep them sharded), then
      // all-gather the updated parameters, hidden behind the next step's first forward.
      const double rs = both(Collective::ReduceScatter, params_per_rank, experts_per_rank, grad);
      const double ag = both(Collective::AllGather, params_per_rank, experts_per_rank, param);
      const double reductions = l.zero_stage == 2 ? static_cast<double>(micro) : 1.0;
      out.dp_comm_s = reductions * rs + ag;
      exposed += reductions * std::max(0.0, rs - last_backward) + std::max(0.0, ag - static_cast<double>(l.vp) * t_f);
    } else {
      // ZeRO-3: per micro-batch, each layer is gathered for forward and for backward and its
      // gradients reduce-scattered; prefetch hides each layer's traffic behind the previous
      // layer's compute, so only the excess is exposed.
      const double layers = static_cast<double>(held.layers);
      const double dense_layer = held.block / layers, expert_layer = held.experts / layers;
      double ag = 0, rs = 0, backward_gathers = 1;
      if (job.zero3_traffic == Zero3Traffic::DeepSpeed) {
        // Every rank's bytes over its own network link (one rank per node as far as the
        // collective is concerned), 16-bit gradients, one more gather per recomputed forward.
        GroupTopology flat = dp_group, flat_experts = expert_group;
        flat.ranks_per_node = flat_experts.ranks_per_node = 1;
        ag = collective_time(Collective::AllGather, dense_layer * param, flat).seconds +
             collective_time(Collective::AllGather, expert_layer * param, flat_experts).seconds;
        rs = collective_time(Collective::ReduceScatter, dense_layer * param, flat).seconds +
             collective_time(Collective::ReduceScatter, expert_layer * param, flat_experts).seconds;
        if (l.recompute == Recompute::Full) backward_gathers = 1 + job.memory.full_recompute_share;
      } else {
        ag = both(Collective::AllGather, dense_layer, expert_layer, param);
        rs = both(Collective::ReduceScatter, dense_layer, expert_layer, grad);
      }
      if (job.frozen_base) rs = 0;  // no gradient to reduce-scatter
      if (job.memory.fsdp_gathered_under_pp && l.pp > 1) {
        // FSDP2 under pipelining (GpuJob::fsdp_gathered_under_pp): each layer gathered once, at
        // its first forward, and its gradients reduce-scattered once, after its last backward.
        out.dp_comm_s = layers * (ag + rs);
        exposed +=
            layers * (std::max(0.0, ag - layer.forward_s) + std::max(0.0, rs - layer.backward_s));
      } else {
        out.dp_comm_s = static_cast<double>(micro) * layers * ((1 + backward_gathers) * ag + rs);
        exposed += static_cast<double>(micro) * layers *
                   (std::max(0.0, ag - layer.forward_s) +
                    std::max(0.0, backward_gathers * ag + rs - layer.backward_s));
      }
    }
  }
  // Activation offloading (GpuJob::offloaded_layers, pp 1): the k stashes leave over the host
  // link one after another from the first layer's forward on, the last due by the end of the
  // forward (n - 1 more layers), and come back during the backward the same way; per micro-batch
  // only what outlasts those passes shows.
  if (job.memory.offloaded_layers > 0) {
    check_offloaded_layers(m, l, job.memory);
    const double copies_s = static_cast<double>(job.memory.offloaded_layers) *
                            stashed_layer_bytes(m, l, job.memory) / host_link_bytes_per_s(gpu);
    const double others = layers_per_rank - 1;
    out.offload_s =
        static_cast<double>(micro) * (std::max(0.0, copies_s - others * layer.forward_s) +
                                      std::max(0.0, copies_s - others * layer.backward_s));
    exposed += out.offload_s;
  }
  out.exposed_comm_s = std::max(0.0, exposed);
  // AdamW reads gradient, master, two moments and writes master, moments and the parameter:
  // about 32 bytes per parameter it owns, at HBM bandwidth (loom's CUDA engine: 30 in its AdamW
  // kernel and 4 for the gradient norm's read, at the calibrated streaming rate).
  const double owned = l.zero_stage >= 1 ? params_per_rank / static_cast<double>(replicas) +
                                               experts_per_rank / static_cast<double>(expert_replicas)
                                         : params_per_rank + experts_per_rank;
  out.optimizer_s = job.frozen_base ? 0.0
                                     : owned * 32 / (loom_cuda ? stream_rate : gpu.hbm_bandwidth_bytes_per_s) *
                                           sharing;
  out.total_s = makespan + (out.exposed_comm_s - (busy - out.compute_s)) + out.optimizer_s;
  const double step_tokens = static_cast<double>(job.global_batch * job.seq_len);
  out.tokens_per_s = step_tokens / out.total_s;
  // A frozen base computes 4 of training's 6 FLOPs a parameter (forward and input gradients);
  // the attention's backward is not frozen, so this counts a little less than is computed.
  out.mfu = (job.frozen_base ? 4.0 / 6.0 : 1.0) * flops_per_token(m, job.seq_len) * step_tokens /
            (out.total_s * static_cast<double>(l.gpus()) * gpu.bf16_tflops * 1e12);
  return out;
}

}  // namespace loom::plan
