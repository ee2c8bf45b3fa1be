// The planner's time model and its search over layouts: sanity against hand-derived
// relations (no communication on one GPU, bubble from the schedule, tp traffic), and the
// search's three steps on small and very large clusters.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/plan/collectives.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/search.hpp"
#include "loom/plan/time_model.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

plan::ClusterSpec h100s(int64_t gpus) {
  plan::ClusterSpec c;
  c.gpus_per_node = std::min<int64_t>(8, gpus);
  c.nodes = gpus / c.gpus_per_node;
  return c;
}

plan::TrainingJob job(int64_t seq, int64_t global_batch) {
  plan::TrainingJob j;
  j.seq_len = seq;
  j.global_batch = global_batch;
  j.memory.seq_len = seq;
  j.memory.micro_batches = 1;
  return j;
}

TEST(PlanTime, OneGpuIsComputePlusOptimizerAndMfuStaysBelowTheGemmCeiling) {
  const ModelConfig m = model_preset("llama-1b");
  const plan::StepTime t = plan::predict_step_time(m, plan::parse_layout("mbs=4"), h100s(1), job(2048, 32));
  EXPECT_EQ(t.micro_batches, 8);
  EXPECT_DOUBLE_EQ(t.exposed_comm_s, 0);
  EXPECT_DOUBLE_EQ(t.bubble_s, 0);
  EXPECT_NEAR(t.total_s, t.compute_s + t.optimizer_s, 1e-12);
  EXPECT_GT(t.mfu, 0.3);
  EXPECT_LT(t.mfu, plan::default_gemm_efficiency(plan::gpu_preset("h100-sxm")).peak_fraction);
  EXPECT_NEAR(t.tokens_per_s, 32.0 * 2048 / t.total_s, 1e-6 * t.tokens_per_s);
}

TEST(PlanTime, RanksBeyondTheCoresTakeTurns) {
  // loom's engine with 4 ranks on 2 cores: with every rank busy throughout (dp = 4) each runs at
  // half speed, so compute and the optimizer take twice as long and the traffic is unchanged.
  const ModelConfig m = model_preset("llama-1b");
  plan::ClusterSpec own = h100s(4), shared = h100s(4);
  shared.cores = 2;
  const plan::PlanLayout dp4 = plan::parse_layout("dp=4,mbs=1");
  const plan::StepTime a = plan::predict_step_time(m, dp4, own, job(2048, 16));
  const plan::StepTime b = plan::predict_step_time(m, dp4, shared, job(2048, 16));
  EXPECT_NEAR(b.compute_s, 2 * a.compute_s, 1e-12 * b.compute_s);
  EXPECT_NEAR(b.optimizer_s, 2 * a.optimizer_s, 1e-12 * b.optimizer_s);
  EXPECT_NEAR(b.dp_comm_s, a.dp_comm_s, 1e-12 * a.dp_comm_s);
  // A pipeline (pp 2 x dp 2): ranks idle in the bubble lend their cores, so the step is shorter
  // than the dedicated one's at half speed, yet longer than the dedicated one.
  const plan::PlanLayout pp2 = plan::parse_layout("pp=2,dp=2,mbs=1");
  const plan::StepTime c = plan::predict_step_time(m, pp2, own, job(2048, 16));
  const plan::StepTime d = plan::predict_step_time(m, pp2, shared, job(2048, 16));
  const double makespan_c = c.compute_s + c.bubble_s + c.tp_comm_s, makespan_d = d.compute_s + d.bubble_s + d.tp_comm_s;
  EXPECT_LT(makespan_d, 2 * makespan_c);
  EXPECT_GT(makespan_d, makespan_c);
  shared.cores = -1;
  EXPECT_THROW(shared.validate(), Error);
}

TEST(PlanTime, PipelineBubbleFollowsTheScheduleAndRecomputationCostsCompute) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::ClusterSpec cluster = h100s(8);
  // Same GPUs, p = 4 stages of 8 layers, m = 8 micro-batches. The last stage also runs the head,
  // so it sets the pace and the others wait on it; its own idle time is the first forward's way
  // down stages 0-2 and the last backward's way back: 3 (F + B) of an 8-layer stage plus 6
  // sends, (p - 1)/m of the work as 1F1B's formula says when every stage is alike, less here.
  const plan::PlanLayout one_layout = plan::parse_layout("pp=4,dp=2,mbs=1");
  const plan::StepTime one = plan::predict_step_time(m, one_layout, cluster, job(4096, 16));
  const plan::StepTime inter = plan::predict_step_time(m, plan::parse_layout("pp=4,dp=2,mbs=1,v=2"), cluster, job(4096, 16));
  const plan::LayerTime layer = plan::predict_layer_time(m, one_layout, cluster, job(4096, 16));
  const double light = 8 * (layer.forward_s + layer.backward_s);
  EXPECT_NEAR(one.bubble_s, 3 * light + 6 * one.p2p_s, 1e-9 * one.bubble_s);
  EXPECT_LT(one.bubble_s / one.compute_s, 3.0 / 8);
  // Interleaving with v = 2 halves the fill and drain, about.
  EXPECT_NEAR(inter.bubble_s / one.bubble_s, 0.5, 0.1);
  const plan::StepTime full = plan::predict_step_time(m, plan::parse_layout("pp=4,dp=2,recompute=full"), cluster, job(4096, 16));
  EXPECT_NEAR(full.compute_s / one.compute_s, 4.0 / 3, 0.1);  // one more forward per backward
  EXPECT_THROW(plan::predict_step_time(m, plan::parse_layout("dp=8,mbs=3"), cluster, job(4096, 16)), Error);
}

TEST(PlanTime, TensorParallelTrafficIsPaidInsideTheStep) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::StepTime tp = plan::predict_step_time(m, plan::parse_layout("tp=8,sp=1"), h100s(8), job(4096, 8));
  EXPECT_GT(tp.tp_comm_s, 0);
  EXPECT_GE(tp.exposed_comm_s, tp.tp_comm_s * 0.99);  // Megatron-style TP is not overlapped
  const plan::StepTime dp = plan::predict_step_time(m, plan::parse_layout("dp=8,zero=1"), h100s(8), job(4096, 8));
  EXPECT_DOUBLE_EQ(dp.tp_comm_s, 0);
  EXPECT_GT(dp.dp_comm_s, 0);
}

// Overlapped tp communication (Transformer Engine's userbuffers as NeMo's H100 configs set them),
// by hand with GEMMs at exactly the peak: llama-8b, tp 2 with sequence parallelism, one sequence
// of 4096. Forward linear GEMMs 2 x 4096 x (4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x
// 14336) / 2 FLOPs; each of the four collectives moves the [4096, 4096] bf16 activations. Comm
// (one collective, c) is shorter than half the forward GEMMs (g / 2), so forward leaves c / tp
// (the ring's first chunk, tp = 2) + c / 4 (the reduce-scatter's 4 splits) of its 2c exposed,
// backward c / tp of the ring and nothing of the bulk reduce-scatter. Without sequence
// parallelism nothing is overlapped (Megatron-LM asserts it for tp_comm_overlap).
TEST(PlanTime, OverlappedTensorParallelTrafficLeavesTheFirstChunkExposed) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::ClusterSpec cluster = h100s(8);
  plan::TrainingJob j = job(4096, 8);
  j.gemm = plan::GemmEfficiency{1.0, 0.0};
  const plan::PlanLayout l = plan::parse_layout("tp=2,sp=1");
  const plan::LayerTime plain = plan::predict_layer_time(m, l, cluster, j);
  j.tp_comm_overlap = true;
  const plan::LayerTime overlapped = plan::predict_layer_time(m, l, cluster, j);
  const double c = plan::collective_time(plan::Collective::AllReduce, 4096.0 * 4096 * 2,
                                         plan::group_topology(cluster, 2, 1))
                       .seconds;
  const double g = 2 * 4096.0 * (4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3 * 4096.0 * 14336) /
                   2 / (cluster.gpu.bf16_tflops * 1e12);
  ASSERT_LT(c, g / 2);
  EXPECT_NEAR(plain.forward_s - overlapped.forward_s, 2 * c - (c / 2 + c / 4),
              1e-9 * plain.forward_s);
  EXPECT_NEAR(plain.backward_s - overlapped.backward_s, 2 * c - c / 2, 1e-9 * plain.backward_s);
  const plan::PlanLayout no_sp = plan::parse_layout("tp=2");
  const plan::LayerTime without = plan::predict_layer_time(m, no_sp, cluster, j);
  j.tp_comm_overlap = false;
  EXPECT_EQ(without.forward_s, plan::predict_layer_time(m, no_sp, cluster, j).forward_s);
}

// Full recomputation on a share of the layers (torchtitan's "selective layer": every n-th layer
// checkpointed, the rest keep everything): the backward reruns that share of the forward, and
// the activations are that share of a checkpointed layer's plus the rest of a plain one's.
TEST(PlanTime, CheckpointingEveryOtherLayerRerunsHalfTheForward) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::ClusterSpec cluster = h100s(8);
  plan::TrainingJob j = job(4096, 8);
  const plan::LayerTime none =
      plan::predict_layer_time(m, plan::parse_layout("dp=8,zero=3"), cluster, j);
  const plan::PlanLayout full = plan::parse_layout("dp=8,zero=3,recompute=full");
  const plan::LayerTime every = plan::predict_layer_time(m, full, cluster, j);
  j.memory.full_recompute_share = 0.5;
  const plan::LayerTime half = plan::predict_layer_time(m, full, cluster, j);
  EXPECT_DOUBLE_EQ(every.backward_s - none.backward_s, none.forward_s);
  EXPECT_NEAR(half.backward_s - none.backward_s, 0.5 * none.forward_s, 1e-12);
  EXPECT_DOUBLE_EQ(half.forward_s, none.forward_s);
  plan::GpuJob g = j.memory;
  const double a_half = plan::predict_gpu_memory(m, full, g).activations;
  g.full_recompute_share = 1;
  const double a_full = plan::predict_gpu_memory(m, full, g).activations;
  const double a_none =
      plan::predict_gpu_memory(m, plan::parse_layout("dp=8,zero=3"), g).activations;
  // Full: every layer's checkpoint plus one layer rebuilt (a plain layer's bytes, L = 32).
  const double rebuilt = a_none / 32;
  EXPECT_NEAR(a_half, 0.5 * (a_full - rebuilt) + 0.5 * a_none + rebuilt, 1e-6 * a_none);
}

TEST(PlanSearch, FollowsTheThreeStepsAndRanksFittingLayoutsFastestFirst) {
  const plan::SearchResult r = plan::search_layouts(model_preset("llama-8b"), h100s(64), job(4096, 512));
  EXPECT_GT(r.valid, 0);
  EXPECT_LE(r.fitting, r.valid);
  EXPECT_LE(r.batch_ok, r.fitting);
  ASSERT_FALSE(r.ranked.empty());
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    EXPECT_EQ(r.ranked[i].layout.gpus(), 64);
    EXPECT_LE(r.ranked[i].memory.total(), r.usable_bytes);
    EXPECT_EQ(512 % (r.ranked[i].layout.dp * r.ranked[i].layout.micro_batch), 0);
  }
  for (size_t i = 1; i < 32 && i < r.ranked.size(); ++i)
    EXPECT_GE(r.ranked[i - 1].time.tokens_per_s, r.ranked[i].time.tokens_per_s * 0.999);
  EXPECT_NE(plan::explain_winner(r).find(r.ranked[0].layout.describe()), std::string::npos);
}

TEST(PlanSearch, LargeClustersWorkAndAModelThatCannotFitSaysWhatWould) {
  // Llama-405B on 16,384 and on 262,144 GPUs: layouts found, all finite.
  for (const int64_t gpus : {int64_t{16384}, int64_t{262144}}) {
    const plan::SearchResult r = plan::search_layouts(model_preset("llama-405b"), h100s(gpus), job(8192, 4096), 4);
    ASSERT_FALSE(r.ranked.empty()) << gpus;
    EXPECT_TRUE(std::isfinite(r.ranked[0].time.tokens_per_s));
    EXPECT_GT(r.ranked[0].time.mfu, 0.05);
    EXPECT_LT(r.ranked[0].time.mfu, 0.8);
  }
  // 405B on 8 GPUs: even fully sharded, 16 bytes per parameter need ~6.5 TB.
  const plan::SearchResult none = plan::search_layouts(model_preset("llama-405b"), h100s(8), job(8192, 64), 4);
  EXPECT_EQ(none.fitting, 0);
  EXPECT_GT(none.gpus_needed, 8);
  EXPECT_LE(none.gpus_needed, 1024);
}

// DeepSpeed's ZeRO-3 (ZeRO++ sec. 3): each layer's 16-bit weights gathered for forward, again
// for the recomputed forward and for backward, and its 16-bit gradients reduce-scattered, each
// a ring over all 16 ranks on every GPU's own 50 GB/s network link: per layer and micro-batch
// 4 x 15 steps of (9.6 us + 2 P / 16 / 50e9 s). Llama 3 8B's layer: P = 4096 x (4096 + 2 x 1024)
// (q, k, v) + 4096^2 (o) + 3 x 4096 x 14336 (SwiGLU) + 2 x 4096 (norms) = 218,112,000.
TEST(PlanTime, DeepSpeedZeroThreeSendsEveryGpusBytesOverItsOwnLink) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::PlanLayout l = plan::parse_layout("dp=16,zero=3,mbs=1,recompute=full");
  plan::TrainingJob deepspeed = job(4096, 16);
  deepspeed.zero3_traffic = plan::Zero3Traffic::DeepSpeed;
  const plan::StepTime t = plan::predict_step_time(m, l, h100s(16), deepspeed);
  const double per_layer = 218112000.0;
  const double ring = 15 * (9.6e-6 + 2 * per_layer / 16 / 50e9);
  EXPECT_NEAR(t.dp_comm_s, 32 * 4 * ring, 1e-9);
  // NCCL's hierarchical collectives (FSDP) move the same bytes far faster: NVLink inside the
  // node, an eighth over each NIC.
  const plan::StepTime fsdp = plan::predict_step_time(m, l, h100s(16), job(4096, 16));
  EXPECT_LT(fsdp.dp_comm_s, t.dp_comm_s / 4);
}

// Interleaving: a steady pipeline runs at the busiest rank's work per micro-batch. With p = 2,
// v = 2 the last rank holds stages 1 and 3 (8 layers each, the head on stage 3), so its mean
// chunk is (16 F + head) / 2: exactly half the v = 1 stage of 16 layers with the head.
TEST(PlanTime, InterleavedChunksRunAtTheBusiestRanksMeanPace) {
  const ModelConfig m = model_preset("llama-8b");
  const plan::StepTime one =
      plan::predict_step_time(m, plan::parse_layout("pp=2,dp=4,mbs=1"), h100s(8), job(4096, 16));
  const plan::StepTime two = plan::predict_step_time(m, plan::parse_layout("pp=2,dp=4,mbs=1,v=2"),
                                                     h100s(8), job(4096, 16));
  EXPECT_NEAR(two.chunk_forward_s, one.chunk_forward_s / 2, 1e-12);
  EXPECT_NEAR(two.chunk_backward_s, one.chunk_backward_s / 2, 1e-12);
}

}  // namespace
}  // namespace loom::test
