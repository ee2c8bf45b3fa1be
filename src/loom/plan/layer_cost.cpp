#include "loom/plan/layer_cost.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/model/flops.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/engine_fp8.hpp"
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
// With MXFP8's own rate below (kMxfp8GemmRate) the pairs' median ratio error is -0.3% at 0.70;
// 0.74 over-predicts it by +2.6%. Transformer Engine's kernel-only figures on a B300 (below) put
// NVFP4 at 1.81x FP8's per-tensor kernels, 0.58 of the peak ratio: the recipe's training runs
// gain more than that suggests, so the fit stays.
constexpr double kNvfp4GemmRateShare = 0.70;

// MXFP8 (Transformer Engine's MXFP8BlockScaling, Blackwell: E4M3 with an E8M0 scale per 32
// elements along the contraction) GEMM kernels against per-tensor FP8's: Transformer Engine's
// GEMM profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst, "Autocast vs
// Pre-quantized", B300, hidden 4096, intermediate 16384, 15,872 tokens, inputs quantised
// beforehand): 6.812 ms per layer's twelve GEMMs in FP8 current scaling, 7.161 ms in MXFP8.
// Measured, not fitted; the casts are charged as per-tensor FP8's (gemm_s).
constexpr double kMxfp8GemmRate = 6.812 / 7.161;

}  // namespace

LayerCost layer_cost(const ModelConfig& m, const PlanLayout& l, const ClusterSpec& cluster,
                     const TrainingJob& job, const GemmEfficiency& gemm) {
  const GpuSpec& gpu = cluster.gpu;
  const double peak = gpu.bf16_tflops * 1e12;
  const bool fp8 = job.fp8_gemms && gpu.fp8_tflops > 0;
  const bool fp4 = fp8 && job.fp4_gemms && gpu.fp4_tflops > 0;
  const double linear_peak = fp4   ? kNvfp4GemmRateShare * gpu.fp4_tflops * 1e12
                             : fp8 ? gpu.fp8_tflops * 1e12 * (job.mx_gemms ? kMxfp8GemmRate : 1.0)
                                   : peak;
  const double tokens = static_cast<double>(l.micro_batch * job.seq_len / l.cp),
               t = static_cast<double>(l.tp);
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
  // Split over `split` ranks: tp, or 1 for experts whole on every tp rank.
  auto mlp_in_s = [&](double rows, double width, double in, double split) {
    return two_matrices ? gemm_s(rows, width / split, in) + gemm_s(rows, in, width / split)
                        : gemm_s(rows, 2 * width / split, in) + gemm_s(rows, in, width / split);
  };
  auto mlp_s = [&](double rows, double width) { return mlp_in_s(rows, width, h, t); };
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
    const double k = static_cast<double>(m.experts_per_token),
                 experts = static_cast<double>(m.n_experts);
    const double ep = static_cast<double>(l.ep), fe = static_cast<double>(m.expert_ffn());
    // Under ep the busiest rank's experts see `imbalance` x the mean rows (TrainingJob); with one
    // rank holding every expert the rows add up to k x tokens however they are routed.
    const double imbalance = l.ep > 1 ? moe_imbalance_of(m, job) : 1.0;
    // A latent MoE's experts run on latent-wide rows, between one down and one up projection.
    const double width = m.moe_latent > 0 ? static_cast<double>(m.moe_latent) : h;
    // Experts split over tp (Megatron-Core's expert tensor parallelism) or whole on every tp
    // rank (TrainingJob::experts_whole_on_tp: the micro-batch's rows on each, or under sequence
    // parallelism the rank's own).
    const bool whole = job.experts_whole_on_tp && l.tp > 1;
    const double expert_split = whole ? 1.0 : t;
    const double expert_rows = whole && l.sequence_parallel ? tokens / t : tokens;
    double moe = experts / ep *
                     mlp_in_s(imbalance * expert_rows * k * ep / experts, fe, width, expert_split) +
                 gemm_s(tokens, experts, h);
    if (m.moe_latent > 0) moe += gemm_s(tokens, width, h) + gemm_s(tokens, h, width);
    if (m.n_shared_experts > 0)
      moe += mlp_in_s(expert_rows, static_cast<double>(m.n_shared_experts) * fe, h, expert_split);
    forward += moe_share * moe;
    if (l.ep > 1) {
      // Dispatch and combine: each all-to-all moves this rank's k routed copies of its tokens
      // (or one per destination rank: moe_dispatch_copies), split over tp as with
      // sequence-parallel dispatch (experts whole on every tp rank: the rows it runs); backward
      // runs both again. Not overlapped: the experts wait for their tokens.
      const double bytes = imbalance * (whole ? expert_rows : tokens / t) *
                           moe_dispatch_copies(m, l.ep, job) * width * job.memory.activation_bytes;
      c.ep_comm_s =
          moe_share * 4 *
          collective_time(Collective::AllToAll, bytes, group_topology(cluster, l.ep, l.tp)).seconds;
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
  c.weight_grad_s = job.frozen_base ? 0.0 : forward;
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
  // The input-gradient GEMMs (as many FLOPs as the forward's) and W.
  c.backward_s = linear_forward + c.weight_grad_s + attention_backward_s + scores_backward_s +
                 memory_s / 2 + cast_backward_s + norm_backward_s;
  // loom's CPU engine in FP8: its linear layers' quantisations (engine_fp8.hpp), rerun with the
  // forward under full recomputation (below).
  const EngineFp8Cost fp8_engine = engine_fp8_layer_cost(m, l, cluster, job);
  c.forward_s += fp8_engine.forward_s;
  c.backward_s += fp8_engine.backward_s;
  c.fp8_reduce_forward_s = fp8_engine.forward_reduce_s;
  c.fp8_reduce_backward_s = fp8_engine.backward_reduce_s;
  if (l.recompute == Recompute::Full) {
    c.backward_s += job.memory.full_recompute_share * c.forward_s;
    c.fp8_reduce_backward_s += job.memory.full_recompute_share * fp8_engine.forward_reduce_s;
  }
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
    // Half the backward's GEMMs, the input gradients' and W's (none under a frozen base).
    const double backward_half = (linear_forward + c.weight_grad_s) / 2;
    if (job.tp_async_backward && !(job.tp_comm_overlap && l.sequence_parallel)) {
      // Each of the backward's two collective pairs (an all-reduce; under sequence parallelism
      // an all-gather and a reduce-scatter) runs beside the GEMMs of the column-parallel linear it
      // serves: half the layer's backward GEMMs.
      c.tp_exposed_backward_s = 2 * std::max(0.0, one - backward_half);
    }
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
      // The bulk reduce-scatters hide behind W (which a frozen base does not run).
      c.tp_exposed_backward_s =
          chunked(comm, backward_half, t) + std::max(0.0, comm - c.weight_grad_s);
    }
    // Full recomputation reruns the forward in the backward, its collectives too (Megatron-LM's
    // tensor_parallel.checkpoint calls the layer's forward again, RowParallelLinear's all-reduce
    // or reduce-scatter included).
    if (l.recompute == Recompute::Full) {
      const double share = job.memory.full_recompute_share;
      c.tp_comm_s += share * 2 * one;
      c.tp_exposed_backward_s += share * c.tp_exposed_forward_s;
    }
    // loom's engine keeps a mixture-of-experts block whole on every tp rank
    // (TrainingJob::experts_whole_on_tp): its feed-forward runs on the rows the rank has, with
    // no collective, so a MoE layer has its attention's pair only. Under sequence parallelism
    // those rows are the rank's own, so the block's gradients (router, this ep rank's experts,
    // the shared experts) are partial sums, all-reduced over tp after every micro-batch's
    // backward (Transformer::sum_partial_grads), in f32.
    // (TrainingJob::tp_reduce_per_column_linear, a published convention, has already taken
    // the MoE layers' third reduction out; the two never meet: experts_whole_on_tp is loom's
    // profile's alone.)
    if (job.experts_whole_on_tp && moe_share > 0) {
      LOOM_CHECK(
          !job.tp_reduce_per_column_linear,
          "layer_cost: experts_whole_on_tp (loom's engine) with tp_reduce_per_column_linear");
      const double kept = 1 - moe_share / 2;
      c.tp_comm_s *= kept;
      c.tp_exposed_forward_s *= kept;
      c.tp_exposed_backward_s *= kept;
      if (l.sequence_parallel) {
        // One all-reduce per parameter (all_reduce_sequence_parallel_grads): the router [E, h],
        // this ep rank's experts' gate, up and down [f, h] each, the shared experts' [S f, h].
        const double experts = static_cast<double>(m.n_experts),
                     fe = static_cast<double>(m.expert_ffn()),
                     shared = static_cast<double>(m.n_shared_experts);
        auto all_reduce = [&](double elements) {
          return collective_time(Collective::AllReduce, 4 * elements, tp_group).seconds;
        };
        const double sums = all_reduce(experts * h) +
                            3 * experts / static_cast<double>(l.ep) * all_reduce(h * fe) +
                            (shared > 0 ? 3 * all_reduce(shared * h * fe) : 0.0);
        c.tp_comm_s += moe_share * sums;
        c.tp_exposed_backward_s += moe_share * sums;
      }
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
        const Link link =
            l.tp * l.ep * l.cp <= cluster.gpus_per_node ? nvlink_of(cluster) : network_of(cluster);
        const double step_fwd = p2p_time(wire.forward / hops, link),
                     step_bwd = p2p_time(wire.backward / hops, link);
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
        const double scatter_s =
            collective_time(Collective::ReduceScatter, gathered, cp_group).seconds;
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
        const double fwd =
            collective_time(Collective::AllToAll, wire.forward * whole, cp_group).seconds;
        const double bwd =
            collective_time(Collective::AllToAll, wire.backward * whole, cp_group).seconds;
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

}  // namespace loom::plan
