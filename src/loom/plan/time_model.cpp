#include "loom/plan/time_model.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/model/flops.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/host_issue.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/rank_parameters.hpp"

namespace loom::plan {

namespace {

// NVFP4 linear layers reach this share of the FP4 peak's speedup, at the GEMM efficiency FP8
// GEMMs reach: what Transformer Engine's NVFP4 recipe adds per GEMM (a second, transposed and
// Hadamard-rotated quantisation of each weight-gradient input, 16 x 16 block scales of the
// weights, stochastic rounding of the gradients; NVIDIA 2025, "Pretraining Large Language
// Models with NVFP4", arXiv 2509.25149, sec. 4) and the lower realised rate of 4-bit tensor
// cores. FITTED, to the ratio NVFP4 / MXFP8 of Megatron-Bridge's same-layout Llama 3 70B and
// 405B rows on GB200 and GB300 (26.02 and 26.04 tables, 11 pairs; docs/PLANNER.md, "NVFP4"):
// 0.8 over-predicts the ratio by +3% (median), 0.7 under-predicts it by 4%.
constexpr double kNvfp4GemmRateShare = 0.75;

struct LayerCost {
  double forward_s = 0, backward_s = 0;   // one layer, one micro-batch, compute only
  double weight_grad_s = 0;               // the part of backward_s a split backward's W does
  double attention_core_s = 0;            // forward QK^T and PV (recomputed by selective)
  double tp_comm_s = 0;                   // forward + backward (Megatron TP)
  double tp_exposed_forward_s = 0, tp_exposed_backward_s = 0;  // what the GEMMs do not hide
  double ep_comm_s = 0;                   // expert dispatch and combine all-to-alls, forward + backward
  double cp_comm_s = 0;                   // context parallelism, forward + backward
  double cp_exposed_forward_s = 0, cp_exposed_backward_s = 0;  // what the attention core does not hide
};

LayerCost layer_cost(const ModelConfig& m, const PlanLayout& l, const ClusterSpec& cluster, const TrainingJob& job,
                     const GemmEfficiency& gemm) {
  const GpuSpec& gpu = cluster.gpu;
  const double peak = gpu.bf16_tflops * 1e12;
  const bool fp8 = job.fp8_gemms && gpu.fp8_tflops > 0;
  const bool fp4 = fp8 && job.fp4_gemms && gpu.fp4_tflops > 0;
  const double linear_peak =
      fp4 ? kNvfp4GemmRateShare * gpu.fp4_tflops * 1e12 : fp8 ? gpu.fp8_tflops * 1e12 : peak;
  const double tokens = static_cast<double>(l.micro_batch * job.seq_len / l.cp), t = static_cast<double>(l.tp);
  const double h = static_cast<double>(m.n_embd), f = static_cast<double>(m.ffn_hidden);
  const double kv = static_cast<double>(m.kv_dim()), seq = static_cast<double>(job.seq_len);
  const double q = static_cast<double>(m.q_dim());  // n_embd unless the heads are wider or narrower
  // FP8 casts (Transformer Engine): every linear layer's input forward and its output gradient
  // backward, 3 bytes of HBM traffic per element; summed in gemm_s below.
  double cast_elements_forward = 0, cast_elements_backward = 0;
  auto gemm_s = [&](double rows, double out, double in) {
    if (fp8) {
      cast_elements_forward += rows * in;
      cast_elements_backward += rows * out;
    }
    return 2 * rows * out * in / (linear_peak * gemm.efficiency(rows, out, in));
  };
  LayerCost c;
  // The mean layer: a transformer's every layer has attention and an MLP (dense or experts); a
  // hybrid Mamba stack's layers are one of attention, Mamba-2, dense MLP or experts, each
  // weighted by its count in the pattern.
  const double layers = static_cast<double>(m.n_layer);
  const double attention_share = static_cast<double>(m.attention_layer_count()) / layers;
  const double dense_share = m.is_hybrid() ? static_cast<double>(m.dense_mlp_layer_count()) / layers
                                           : 1 - static_cast<double>(m.moe_layer_count()) / layers;
  const double mamba_share = static_cast<double>(m.hybrid_layer_count('M')) / layers;
  double forward =
      attention_share * (gemm_s(tokens, (q + 2 * kv) / t, h) + gemm_s(tokens, h, q / t));
  // An MLP of `width` on inputs of `in`: up and down (GPT-2's GELU, Nemotron's squared ReLU), or
  // SwiGLU's gate and up as one GEMM, then down.
  const bool two_matrices = m.arch == Architecture::GPT2 || m.squared_relu_mlp;
  auto mlp_in_s = [&](double rows, double width, double in) {
    return two_matrices ? gemm_s(rows, width / t, in) + gemm_s(rows, in, width / t)
                        : gemm_s(rows, 2 * width / t, in) + gemm_s(rows, in, width / t);
  };
  auto mlp_s = [&](double rows, double width) { return mlp_in_s(rows, width, h); };
  const double moe_share = static_cast<double>(m.moe_layer_count()) / layers;
  if (dense_share > 0) forward += dense_share * mlp_s(tokens, f);
  double scan_s = 0;  // a Mamba-2 layer's SSD scan, forward
  if (mamba_share > 0) {
    // A Mamba-2 mixer split over tp by heads: in_proj (h -> z|x|B|C|dt) and out_proj (d_inner ->
    // h) GEMMs; its SSD scan's chunked matmuls (ModelConfig::mamba_scan_flops_per_token) run as
    // a fused attention kernel does over chunk-long key blocks of head_dim-wide heads: the same
    // blocked tensor-core products (Dao & Gu 2024, sec. 6, compare SSD with FlashAttention-2).
    const double inner = static_cast<double>(m.mamba_inner());
    scan_s = tokens * m.mamba_scan_flops_per_token() / t /
             (peak * fused_attention_efficiency(gpu, static_cast<double>(m.mamba_chunk),
                                                static_cast<double>(m.mamba_head_dim)));
    forward += mamba_share * (gemm_s(tokens, static_cast<double>(m.mamba_in_proj()) / t, h) +
                              gemm_s(tokens, h, inner / t));
  }
  if (moe_share > 0) {
    // Mixture of experts with balanced routing: this rank's E/ep experts each see k x tokens x
    // ep / E rows (its own tokens and its ep peers'), so the FLOPs are k dense MLPs' but the
    // GEMMs are shorter. The router scores every token against every expert; shared experts
    // run on every token.
    const double k = static_cast<double>(m.experts_per_token), experts = static_cast<double>(m.n_experts);
    const double ep = static_cast<double>(l.ep), fe = static_cast<double>(m.expert_ffn());
    // Under ep the busiest rank's experts see `imbalance` x the mean rows (TrainingJob); with one
    // rank holding every expert the rows add up to k x tokens however they are routed.
    const double imbalance = l.ep > 1 ? moe_imbalance_of(m, job) : 1.0;
    // A latent MoE's experts run on latent-wide rows, between one down and one up projection.
    const double width = m.moe_latent > 0 ? static_cast<double>(m.moe_latent) : h;
    double moe = experts / ep * mlp_in_s(imbalance * tokens * k * ep / experts, fe, width) +
                 gemm_s(tokens, experts, h);
    if (m.moe_latent > 0) moe += gemm_s(tokens, width, h) + gemm_s(tokens, h, width);
    if (m.n_shared_experts > 0) moe += mlp_s(tokens, static_cast<double>(m.n_shared_experts) * fe);
    forward += moe_share * moe;
    if (l.ep > 1) {
      // Dispatch and combine: each all-to-all moves this rank's k routed copies of its tokens
      // (split over tp, as with sequence-parallel dispatch); backward runs both again. Not
      // overlapped: the experts wait for their tokens.
      const double bytes = imbalance * tokens * k * width / t * job.memory.activation_bytes;
      c.ep_comm_s = moe_share * 4 * collective_time(Collective::AllToAll, bytes, group_topology(cluster, l.ep, l.tp)).seconds;
    }
  }
  // Two matmuls (QK^T, PV). Flash attention skips the masked blocks, so each query meets
  // seq/2 keys on average; materialised scores are computed in full.
  // Sliding-window layers (model.sliding_window) meet at most their window's keys; the mean
  // layer weighs them and the global ones by their counts.
  const bool flash = job.memory.flash_attention;
  const double windowed_share =
      static_cast<double>(m.windowed_layer_count()) / static_cast<double>(m.n_layer);
  const double window_keys =
      m.sliding_window > 0 ? m.mean_keys_per_query(0 /*a windowed layer*/, job.seq_len) : 0;
  const double global_keys = seq / 2;
  const double keys =
      flash ? (1 - windowed_share) * global_keys + windowed_share * window_keys : seq;
  const double head_dim = static_cast<double>(m.head_dim()),
               core_flops = 2 * 2 * tokens * keys * (q / t);
  double attention_backward_s = 0;
  if (flash && !job.attention_forward) {
    // Each kind of layer at the fused kernel's rate for its own key count.
    auto core_s = [&](double share, double layer_keys) {
      if (share <= 0) return 0.0;
      const double eff =
          fused_attention_efficiency(gpu, layer_keys, head_dim, job.attention_kernel_speedup);
      return share * 2 * 2 * tokens * layer_keys * (q / t) / (peak * eff);
    };
    c.attention_core_s =
        core_s(1 - windowed_share, global_keys) + core_s(windowed_share, window_keys);
    attention_backward_s = kFusedAttentionBackwardFlops * c.attention_core_s;
  } else {
    // Materialised scores: QK^T and PV are batched GEMMs whose short side is the head width,
    // but what that costs is the scores' trips through HBM, charged below byte by byte; the
    // matmuls themselves run at the GEMM rate of their long sides (a k of 1e9 saturates).
    const double k = !flash && !job.attention_forward ? 1e9 : head_dim;
    const GemmEfficiency forward_fit = job.attention_forward.value_or(gemm);
    c.attention_core_s =
        core_flops / (peak * measured_efficiency(job.attention_forward_timings, forward_fit, peak,
                                                 tokens, keys, k));
    attention_backward_s =
        job.attention_backward
            ? core_flops / (peak * measured_efficiency(job.attention_backward_timings,
                                                       *job.attention_backward, peak, tokens, keys,
                                                       head_dim))
            : 2 * c.attention_core_s;
  }
  // A hybrid's mean layer: attention in its share of the layers, the Mamba scans in theirs
  // (their backward, as attention's, kFusedAttentionBackwardFlops x the forward). Not in the
  // attention core: selective recomputation does not rerun the scans, CP does not hide behind them.
  c.attention_core_s = attention_share * c.attention_core_s;
  attention_backward_s =
      attention_share * attention_backward_s + mamba_share * kFusedAttentionBackwardFlops * scan_s;
  // W: the weight-gradient GEMMs, as many FLOPs as the forward's linear layers (Qi et al. 2023,
  // sec 2: B carries the input-gradient GEMMs and the attention backward).
  c.weight_grad_s = forward;
  const double linear_forward = forward;
  forward += c.attention_core_s + mamba_share * scan_s;
  // Materialised scores [a/t, tokens, seq] pass through HBM: forward writes them, the fused
  // scale-mask-softmax reads and writes, dropout reads, writes and keeps a 1-byte mask, PV
  // reads (13 bytes per score in bf16); backward reads and writes about 19 (Megatron-LM's
  // fused softmax and dropout kernels, Shoeybi et al. 2019). As PyTorch ops, LLaMA's
  // reference (GpuJob::unfused_softmax), every op is a trip through HBM, in bytes per score:
  // forward, QK^T writes 2, / sqrt(d) reads 2 writes 2, + mask 2 + 2, .float() 2 + 4,
  // softmax 4 + 4, .type_as() 4 + 2, PV reads 2: 32; backward, PV's gradient writes dP 2 and
  // reads P 2, type_as's 2 + 4, softmax's reads the output and the gradient and writes 4 + 4 +
  // 4, float()'s 4 + 2, the division's 2 + 2, QK^T's gradients read dS twice 2 + 2: 36.
  double scores_forward_s = 0, scores_backward_s = 0;
  if (!flash) {
    const double scores = attention_share * tokens * static_cast<double>(m.n_head) / t * seq;
    const bool unfused = job.memory.unfused_softmax;
    scores_forward_s = (unfused ? 32 : 13) * scores / gpu.hbm_bandwidth_bytes_per_s;
    scores_backward_s = (unfused ? 36 : 19) * scores / gpu.hbm_bandwidth_bytes_per_s;
    c.attention_core_s += scores_forward_s;
  }
  // Memory-bound work (norms, residual adds, activation functions, RoPE): every stored
  // activation written once forward and read once backward, plus as much again for its gradient.
  PlanLayout stored = l;
  stored.recompute = Recompute::None;
  const double memory_s = job.memory.loom_cuda_device_memory > 0
                              ? loom_cuda_layer_memory_s(m, l, job, gpu.hbm_bandwidth_bytes_per_s)
                              : 4 *
                                    layer_activation_bytes(m, l.micro_batch, job.seq_len, stored,
                                                           job.memory.activation_bytes) /
                                    gpu.hbm_bandwidth_bytes_per_s;
  const double cast_forward_s = 3 * cast_elements_forward / gpu.hbm_bandwidth_bytes_per_s;
  const double cast_backward_s = 3 * cast_elements_backward / gpu.hbm_bandwidth_bytes_per_s;
  // RMSNorm as PyTorch ops (GpuJob::unfused_rmsnorm), HBM bytes per element of each of the
  // two norms beyond a fused kernel's (read 2, write 2 forward; read 4, write 2 backward).
  // Forward, bf16 x: float() r2 w4, pow r4 w4, mean r4, x * rsqrt r4 w4, type_as r4 w2,
  // * weight r2 w2: 36. Backward through autograd, whose reductions and broadcasts are not
  // fused: the weight's multiply (g * w r2 w2; the weight gradient writes g * y r4 w2, then
  // sums it r2) 12, type_as's r2 w4 6, the multiply by rsqrt (g * r r4 w4; rsqrt's gradient
  // writes g * x r8 w4, then sums it r4) 24, mean's expand / n w4, pow's backward
  // (grad * (2 * x.pow(1)): the copy r4 w4, the scaling r4 w4, the product r8 w4) 28, the
  // two gradients of x summed r8 w4 12, float()'s r4 w2 6: 92.
  double norm_forward_s = 0, norm_backward_s = 0;
  if (job.memory.unfused_rmsnorm) {
    const double elements = 2 * unfused_rmsnorm_rows(m, l, job.seq_len) * h;
    norm_forward_s = (36 - 4) * elements / gpu.hbm_bandwidth_bytes_per_s;
    norm_backward_s = (92 - 6) * elements / gpu.hbm_bandwidth_bytes_per_s;
  }
  c.forward_s = forward + scores_forward_s + memory_s / 2 + cast_forward_s + norm_forward_s;
  c.backward_s = 2 * linear_forward + attention_backward_s + scores_backward_s + memory_s / 2 +
                 cast_backward_s + norm_backward_s;
  if (l.recompute == Recompute::Full) c.backward_s += job.memory.full_recompute_share * c.forward_s;
  if (l.recompute == Recompute::Selective) {
    if (job.memory.selective == SelectivePolicy::TorchtitanOps) {
      // torchtitan's per-op policy (memory_model.hpp) keeps every second matmul's output and
      // the attention core's, so backward reruns wk, wo (not under sequence parallelism, whose
      // saved reduce_scatter output rebuilds the mid residual) and w3 and all of the forward's
      // memory-bound work (norms, RoPE, repeat_kv, SwiGLU), none of it saved.
      double rerun =
          gemm_s(tokens, kv / t, h) + gemm_s(tokens, f / t, h) + memory_s / 2 + norm_forward_s;
      if (!(l.tp > 1 && l.sequence_parallel)) rerun += gemm_s(tokens, h, q / t);
      c.backward_s += rerun;
    } else {
      c.backward_s += c.attention_core_s;
    }
  }
  if (l.tp > 1) {
    // Two all-reduces of the [tokens, h] activations forward and two backward (Megatron-LM,
    // Shoeybi et al. 2019, Fig. 4); sequence parallelism swaps each for a reduce-scatter plus
    // an all-gather, the same bytes (Korthikanti et al. sec. 4.2.2).
    // Under sequence parallelism each is a reduce-scatter and an all-gather (rings: NVLink SHARP
    // speeds up NCCL's all-reduce alone here, collectives.hpp).
    const GroupTopology tp_group = group_topology(cluster, l.tp, 1);
    const double tp_bytes = tokens * h * job.memory.activation_bytes;
    const double one =
        l.sequence_parallel
            ? collective_time(Collective::ReduceScatter, tp_bytes, tp_group).seconds +
                  collective_time(Collective::AllGather, tp_bytes, tp_group).seconds
            : collective_time(Collective::AllReduce, tp_bytes, tp_group).seconds;
    // TrainingJob::tp_reduce_per_column_linear: a third backward all-reduce for the gated MLP's
    // second column-parallel linear, in the dense layers only (a mixture-of-experts layer's
    // experts run whole on every tp rank).
    const double backward_reductions =
        job.tp_reduce_per_column_linear && !l.sequence_parallel && m.arch == Architecture::Llama &&
                !m.is_hybrid()
            ? 2 + (1 - static_cast<double>(m.moe_layer_count()) / static_cast<double>(m.n_layer))
            : 2;
    c.tp_comm_s = (2 + backward_reductions) * one;
    c.tp_exposed_forward_s = 2 * one;
    c.tp_exposed_backward_s = backward_reductions * one;
    if (job.tp_comm_overlap &&
        l.sequence_parallel) {  // Megatron-LM asserts sequence parallelism for it
      // Transformer Engine's userbuffers as NeMo's H100 configs set them
      // (recipes/tp_overlap_configs/userbuffers.py): forward, the all-gathers before the qkv and
      // fc1 GEMMs by ring exchange in tp chunks and the reduce-scatters after proj and fc2
      // pipelined in 4 splits; backward, the dgrad all-gathers by ring exchange and the
      // reduce-scatters "bulk", beside the weight-gradient GEMMs. A chunked overlap costs
      // max(comm, gemm) + min(comm, gemm) / chunks (the first transfer or the last product
      // unhidden); a bulk one only what outlasts its GEMM. Each collective pairs with half the
      // direction's GEMMs (backward's twice the forward's).
      auto chunked = [&](double comm, double gemm, double chunks) {
        return std::max(0.0, comm - gemm) + std::min(comm, gemm) / chunks;
      };
      const double comm = one;  // one of the four collectives of a layer
      c.tp_exposed_forward_s =
          chunked(comm, linear_forward / 2, t) + chunked(comm, linear_forward / 2, 4);
      c.tp_exposed_backward_s =
          chunked(comm, linear_forward, t) + std::max(0.0, comm - linear_forward);
    }
    // Full recomputation reruns the forward in the backward, its collectives too (Megatron-LM's
    // tensor_parallel.checkpoint calls the layer's forward again, RowParallelLinear's all-reduce
    // or reduce-scatter included).
    if (l.recompute == Recompute::Full) {
      const double share = job.memory.full_recompute_share;
      c.tp_comm_s += share * 2 * one;
      c.tp_exposed_backward_s += share * c.tp_exposed_forward_s;
    }
    // A hybrid's block has one mixer, so one column- and row-parallel pair: half a transformer
    // layer's collectives (under tp_comm_overlap each still paired with half the block's GEMMs,
    // as a transformer layer's are).
    if (m.is_hybrid()) {
      c.tp_comm_s /= 2;
      c.tp_exposed_forward_s /= 2;
      c.tp_exposed_backward_s /= 2;
    }
  }
  if (l.cp > 1) {
    // One attention layer's core (c.attention_core_s is the mean layer's: a hybrid's attention
    // share of it): what one attention layer's exchange hides behind.
    const double hops = static_cast<double>(l.cp - 1),
                 core = attention_share > 0 ? c.attention_core_s / attention_share : 0.0;
    const CpWireBytes wire = context_parallel_wire_bytes(m, l, tokens, job.memory.activation_bytes,
                                                         job.memory.cp_gathers_repeated_kv);
    const GroupTopology cp_group = group_topology(cluster, l.cp, l.tp * l.ep);
    switch (l.cp_comm) {
      case CpComm::P2P: {
        // Ring attention (Liu et al. 2023): each hop's block travels while the attention core
        // on the block in hand runs (1/cp of the core forward, twice that backward).
        const Link link = l.tp * l.ep * l.cp <= cluster.gpus_per_node ? nvlink_of(cluster) : network_of(cluster);
        const double step_fwd = p2p_time(wire.forward / hops, link), step_bwd = p2p_time(wire.backward / hops, link);
        const double core_per_hop = core / static_cast<double>(l.cp);
        c.cp_comm_s = hops * (step_fwd + step_bwd);
        c.cp_exposed_forward_s = hops * std::max(0.0, step_fwd - core_per_hop);
        c.cp_exposed_backward_s = hops * std::max(0.0, step_bwd - 2 * core_per_hop);
        break;
      }
      case CpComm::AllGather: {
        // Llama 3 (Dubey et al. 2024, sec. 3.3.2): the gather comes before attention can start,
        // so it is exposed; backward gathers again and reduce-scatters the k|v gradients.
        const double gathered = wire.forward / hops * static_cast<double>(l.cp);
        const double gather_s = collective_time(Collective::AllGather, gathered, cp_group).seconds;
        const double scatter_s = collective_time(Collective::ReduceScatter, gathered, cp_group).seconds;
        c.cp_comm_s = 2 * gather_s + scatter_s;
        // PyTorch's context-parallel SDPA (torchtitan): the gather is issued with the first,
        // local block's attention and waited for before the second (_AllGatherRotater), so that
        // block's share of the core hides it.
        c.cp_exposed_forward_s = job.memory.cp_gathers_repeated_kv
                                     ? std::max(0.0, gather_s - core / static_cast<double>(l.cp))
                                     : gather_s;
        c.cp_exposed_backward_s = gather_s + scatter_s;
        break;
      }
      case CpComm::AllToAll: {
        // Ulysses (Jacobs et al. 2023): all-to-alls before and after attention, exposed. Each
        // moves (C-1)/C of its buffer; collective_time takes the whole send buffer.
        const double whole = static_cast<double>(l.cp) / hops;
        const double fwd = collective_time(Collective::AllToAll, wire.forward * whole, cp_group).seconds;
        const double bwd = collective_time(Collective::AllToAll, wire.backward * whole, cp_group).seconds;
        c.cp_comm_s = fwd + bwd;
        c.cp_exposed_forward_s = fwd;
        c.cp_exposed_backward_s = bwd;
        break;
      }
    }
    // A hybrid: its attention layers' share (its Mamba layers' own context-parallel exchange is
    // not modelled).
    c.cp_comm_s *= attention_share;
    c.cp_exposed_forward_s *= attention_share;
    c.cp_exposed_backward_s *= attention_share;
  }
  return c;
}

}  // namespace

double moe_imbalance_of(const ModelConfig& m, const TrainingJob& job) {
  if (!(job.moe_imbalance >= 1) || !std::isfinite(job.moe_imbalance))
    throw_error("moe_imbalance = ", job.moe_imbalance,
                "; expected a finite number >= 1 (the busiest expert-parallel rank's rows over the mean)");
  return m.moe_capacity_factor > 0 ? std::min(job.moe_imbalance, std::max(1.0, m.moe_capacity_factor))
                                   : job.moe_imbalance;
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
  const double wait_f = c.tp_exposed_forward_s + c.ep_comm_s / 2 + c.cp_exposed_forward_s;
  const double wait_b = c.tp_exposed_backward_s + c.ep_comm_s / 2 + c.cp_exposed_backward_s;
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
  double head_bwd = (head_recomputed ? 3 : 2) * head_gemm +
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
  // one more pass of the head. Its weights and activations are not in the memory model.
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
        n * layer.weight_grad_s + (last ? head_gemm * (1 + static_cast<double>(m.mtp_layers)) : 0),
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
           (last ? head_gemm * (1 + static_cast<double>(m.mtp_layers)) : 0);
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
  const RankParameters held = heaviest_rank_parameters(m, l, stage_layers);
  const double params_per_rank = held.dense(), experts_per_rank = held.experts;
  const int64_t replicas = l.dp * l.cp, expert_replicas = replicas / l.ep;
  const GroupTopology dp_group = group_topology(cluster, replicas, l.tp);
  const GroupTopology expert_group = group_topology(cluster, expert_replicas, l.tp * l.ep);
  // One collective over each set of replicas: the dense weights and the experts.
  auto both = [&](Collective op, double dense_elements, double expert_elements, double bytes_per_element) {
    return collective_time(op, dense_elements * bytes_per_element, dp_group).seconds +
           collective_time(op, expert_elements * bytes_per_element, expert_group).seconds;
  };
  if (replicas > 1) {
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
  out.exposed_comm_s = std::max(0.0, exposed);
  // AdamW reads gradient, master, two moments and writes master, moments and the parameter:
  // about 32 bytes per parameter it owns, at HBM bandwidth (loom's CUDA engine: 30 in its AdamW
  // kernel and 4 for the gradient norm's read, at the calibrated streaming rate).
  const double owned = l.zero_stage >= 1 ? params_per_rank / static_cast<double>(replicas) +
                                               experts_per_rank / static_cast<double>(expert_replicas)
                                         : params_per_rank + experts_per_rank;
  out.optimizer_s =
      owned * 32 / (loom_cuda ? stream_rate : gpu.hbm_bandwidth_bytes_per_s) * sharing;
  out.total_s = makespan + (out.exposed_comm_s - (busy - out.compute_s)) + out.optimizer_s;
  const double step_tokens = static_cast<double>(job.global_batch * job.seq_len);
  out.tokens_per_s = step_tokens / out.total_s;
  out.mfu = flops_per_token(m, job.seq_len) * step_tokens /
            (out.total_s * static_cast<double>(l.gpus()) * gpu.bf16_tflops * 1e12);
  return out;
}

}  // namespace loom::plan
