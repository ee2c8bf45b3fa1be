// Mixture-of-experts planning: experts shard over ep (and their ZeRO state over the replicas
// holding the same experts), dispatch costs all-to-alls, MFU counts active parameters only,
// and the search tries expert parallelism.
#include <gtest/gtest.h>

#include "loom/model/flops.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/host_issue.hpp"
#include "loom/plan/layer_cost.hpp"
#include "loom/plan/rank_parameters.hpp"
#include "loom/plan/search.hpp"
#include "loom/plan/time_model.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

struct Split {
  double dense = 0, expert = 0, root = 0;
  double whole = 0;  // of dense and root: on every tp rank (norms, routers)
};
Split split_of(const ModelConfig& m) {
  Split s;
  for (const ParameterSpec& p : parameter_specs(m)) {
    (p.unit == 0 ? s.root : p.expert ? s.expert : s.dense) += static_cast<double>(p.numel());
    if (!p.expert && p.tp_dim < 0) s.whole += static_cast<double>(p.numel());
  }
  return s;
}

TEST(PlanMoe, ExpertsShardOverEpAndTheirOptimizerOverTheRemainingReplicas) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  const Split s = split_of(m);
  plan::GpuJob job;
  job.seq_len = 4096;
  job.micro_batches = 4;
  const plan::PlanLayout l = plan::parse_layout("tp=2,dp=16,ep=4,zero=1");
  plan::check_layout(l, m, job.seq_len);
  const plan::MemoryBreakdown mem = plan::predict_gpu_memory(m, l, job);
  // One pipeline stage: tp = 2 splits all but the norms and routers.
  const double dense = (s.dense + s.root - s.whole) / 2 + s.whole, experts = s.expert / (2 * 4);
  EXPECT_DOUBLE_EQ(mem.parameters, 2 * (dense + experts));
  EXPECT_DOUBLE_EQ(mem.gradients, 2 * (dense + experts));
  // ZeRO-1: fp32 master + moments over 16 dense replicas, but over 16 / 4 for the experts.
  EXPECT_NEAR(mem.optimizer_state, 12 * (dense / 16 + experts / 4), 1.0);
  // Routing to 2 experts keeps two copies of the MLP interior: more activations than a dense twin.
  ModelConfig dense_twin = m;
  dense_twin.n_experts = dense_twin.experts_per_token = 0;
  plan::PlanLayout one = l;
  one.ep = 1;
  EXPECT_GT(plan::layer_activation_bytes(m, 1, 4096, one, 2), 1.5 * plan::layer_activation_bytes(dense_twin, 1, 4096, one, 2));
}

// Four 8-GPU H100 nodes, and a job of `sequences` sequences of 4096 tokens a step.
plan::ClusterSpec four_nodes() {
  plan::ClusterSpec cluster;
  cluster.nodes = 4;
  return cluster;
}
plan::TrainingJob sequences_of_4096(int64_t sequences) {
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = 4096;
  job.global_batch = sequences;
  return job;
}

TEST(PlanMoe, DispatchCostsAllToAllAndMfuCountsActiveParameters) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  const plan::ClusterSpec cluster = four_nodes();
  plan::TrainingJob job = sequences_of_4096(64);
  job.memory.micro_batches = 2;
  const plan::StepTime no_ep = plan::predict_step_time(m, plan::parse_layout("dp=32,zero=1"), cluster, job);
  const plan::StepTime ep8 = plan::predict_step_time(m, plan::parse_layout("dp=32,ep=8,zero=1"), cluster, job);
  EXPECT_EQ(no_ep.ep_comm_s, 0);
  EXPECT_GT(ep8.ep_comm_s, 0);
  // With ep=8 each rank reduces 1/8 of the expert gradients, over 4 replicas one per node;
  // across nodes the traffic per NIC is then the same as the hierarchical ring's without ep,
  // but the intra-node phases go: measured 0.36 vs 0.71 s.
  EXPECT_LT(ep8.dp_comm_s, 0.6 * no_ep.dp_comm_s);
  // MFU = active-parameter FLOPs: 6 x 12.9B per token, far below 6 x 46.7B.
  const double tokens = 64.0 * 4096;
  EXPECT_NEAR(ep8.mfu, flops_per_token(m, 4096) * tokens / (ep8.total_s * 32 * cluster.gpu.bf16_tflops * 1e12), 1e-12);
  EXPECT_LT(flops_per_token(m, 4096), 0.3 * 6 * static_cast<double>(m.parameter_count()));
}

TEST(PlanMoe, TheBusiestExpertRankSetsThePace) {
  // GEMMs at exactly the peak (efficiency 1 at every shape) so the expert time is FLOPs / peak.
  // Mixtral's layer under ep = 8, 4096 tokens a micro-batch: the busiest rank computes and
  // receives twice the mean rows, so its experts' forward takes 6 x tokens x k x f_e x h more
  // FLOPs (two up-projections of f_e and one down, 2 FLOPs per multiply-add), backward twice
  // that, and each of the 4 all-to-alls (dispatch and combine, forward and backward) moves
  // twice the bytes; the latter are split half to forward, half to backward.
  const ModelConfig m = model_preset("mixtral-8x7b");
  const plan::ClusterSpec cluster = four_nodes();
  plan::TrainingJob job = sequences_of_4096(64);
  job.gemm = plan::GemmEfficiency{1.0, 0.0};
  const plan::PlanLayout l = plan::parse_layout("dp=32,ep=8,zero=1");
  const plan::LayerTime even = plan::predict_layer_time(m, l, cluster, job);
  const plan::PlanLayout no_ep = plan::parse_layout("dp=32,zero=1");
  const double no_ep_even = plan::predict_layer_time(m, no_ep, cluster, job).forward_s;
  job.moe_imbalance = 2;
  const plan::LayerTime skewed = plan::predict_layer_time(m, l, cluster, job);
  const double tokens = 4096, k = 2, fe = static_cast<double>(m.expert_ffn()), h = static_cast<double>(m.n_embd);
  const double expert_forward = 6 * tokens * k * fe * h / (cluster.gpu.bf16_tflops * 1e12);
  const plan::GroupTopology group = plan::group_topology(cluster, 8, 1);
  const double bytes = tokens * k * h * 2;  // bf16 rows
  auto all_to_all = [&](double b) { return plan::collective_time(plan::Collective::AllToAll, b, group).seconds; };
  const double comm = 2 * (all_to_all(2 * bytes) - all_to_all(bytes));  // 4 all-to-alls, half each way
  EXPECT_NEAR(skewed.forward_s - even.forward_s, expert_forward + comm, 1e-9 * even.forward_s);
  EXPECT_NEAR(skewed.backward_s - even.backward_s, 2 * expert_forward + comm, 1e-9 * even.backward_s);
  // Without ep one rank holds every expert: its rows add up to k x tokens however they route.
  EXPECT_EQ(plan::predict_layer_time(m, no_ep, cluster, job).forward_s, no_ep_even);
  // A capacity factor drops rows past c x the mean: the factor is capped at c.
  ModelConfig capped = m;
  capped.moe_capacity_factor = 1.25;
  EXPECT_EQ(plan::moe_imbalance_of(capped, job), 1.25);
  EXPECT_EQ(plan::moe_imbalance_of(m, job), 2);
  job.moe_imbalance = 0.5;
  expect_contains(error_message([&] { plan::predict_layer_time(m, l, cluster, job); }),
                  {"moe_imbalance = 0.5", "expected a finite number >= 1"});
}

// A dispatcher that sends a token once to each rank holding any of its experts (DeepEP):
// Mixtral's 8 experts, 2 a token, on 2, 4 or 8 ranks. A rank of E/g experts misses both of a
// token's with chance C(E - E/g, 2) / C(E, 2): on 2 ranks C(4,2)/C(8,2) = 6/28, so 2 x 22/28 =
// 11/7 ranks are hit; on 4, 4 x (1 - 15/28) = 13/7; on 8 (one expert each) exactly k = 2.
TEST(PlanMoe, OnePerDestinationRankDispatchSendsFewerRows) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  EXPECT_NEAR(plan::expert_groups_hit(m, 2), 11.0 / 7, 1e-12);
  EXPECT_NEAR(plan::expert_groups_hit(m, 4), 13.0 / 7, 1e-12);
  EXPECT_NEAR(plan::expert_groups_hit(m, 8), 2.0, 1e-12);
  EXPECT_NEAR(plan::expert_groups_hit(m, 1), 1.0, 1e-12);
  plan::TrainingJob job = sequences_of_4096(64);
  EXPECT_EQ(plan::moe_dispatch_copies(m, 4, job), 2);  // an all-to-all of permuted rows: k each
  job.moe_dispatch_per_rank = true;
  EXPECT_NEAR(plan::moe_dispatch_copies(m, 4, job), 13.0 / 7, 1e-12);
  // The layer's forward waits for half of the 4 all-to-alls, each now 13/14 of the bytes.
  const plan::ClusterSpec cluster = four_nodes();
  const plan::PlanLayout l = plan::parse_layout("dp=32,ep=4,zero=1");
  const double per_rank = plan::predict_layer_time(m, l, cluster, job).forward_s;
  job.moe_dispatch_per_rank = false;
  const double per_expert = plan::predict_layer_time(m, l, cluster, job).forward_s;
  const plan::GroupTopology group = plan::group_topology(cluster, 4, 1);
  const double bytes = 4096.0 * 2 * static_cast<double>(m.n_embd) * 2;  // bf16 rows, k copies
  auto all_to_all = [&](double b) {
    return plan::collective_time(plan::Collective::AllToAll, b, group).seconds;
  };
  EXPECT_NEAR(per_expert - per_rank, 2 * (all_to_all(bytes) - all_to_all(bytes * 13 / 14)),
              1e-9 * per_rank);
}

// loom's engine runs a MoE layer's experts whole on every tp rank (TrainingJob::
// experts_whole_on_tp): without sequence parallelism each tp rank puts the micro-batch's rows
// through them, so at tp 2 its expert GEMMs take what one rank's take, twice the split experts'
// (Megatron-Core's expert tensor parallelism); with it each rank runs its own half of the rows
// through whole experts, the split experts' FLOPs. At a flat GEMM rate the forward's extra time
// is half of the whole experts' product: 2 x rows x k x 3 h f FLOPs over two; backward twice that.
TEST(PlanMoe, LoomsEngineRunsTheExpertsWholeOnEveryTpRank) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  const plan::ClusterSpec cluster = four_nodes();
  plan::TrainingJob job = sequences_of_4096(64);
  const plan::GemmEfficiency flat{0.5, 0};
  auto cost = [&](const char* layout, bool whole) {
    job.experts_whole_on_tp = whole;
    return plan::layer_cost(m, plan::parse_layout(layout), cluster, job, flat);
  };
  const plan::LayerCost split = cost("tp=2,dp=16", false), whole = cost("tp=2,dp=16", true);
  const double rows = 4096, k = 2, h = static_cast<double>(m.n_embd),
               f = static_cast<double>(m.ffn_hidden);
  const double experts_s = 2 * rows * k * 3 * h * f / (cluster.gpu.bf16_tflops * 1e12 * 0.5);
  EXPECT_NEAR(whole.forward_s - split.forward_s, experts_s / 2, 1e-12 * whole.forward_s);
  EXPECT_NEAR(whole.backward_s - split.backward_s, experts_s, 1e-12 * whole.backward_s);
  const plan::LayerCost split_sp = cost("tp=2,dp=16,sp=1", false),
                        whole_sp = cost("tp=2,dp=16,sp=1", true);
  EXPECT_NEAR(whole_sp.forward_s, split_sp.forward_s, 1e-12 * split_sp.forward_s);
  EXPECT_NEAR(whole_sp.backward_s, split_sp.backward_s, 1e-12 * split_sp.backward_s);
  // At tp 1 there is nothing to split.
  EXPECT_DOUBLE_EQ(cost("dp=32", true).forward_s, cost("dp=32", false).forward_s);
  // Its collectives: Mixtral's every layer is MoE, so only attention's pair of each direction
  // is left, half the split layer's. Under sequence parallelism the block's gradients are
  // partial over the tp ranks' rows: after each micro-batch an f32 all-reduce of each, the
  // router's 8 h and the 8 experts' three h f.
  EXPECT_NEAR(whole.tp_comm_s, split.tp_comm_s / 2, 1e-12 * split.tp_comm_s);
  EXPECT_NEAR(whole.tp_exposed_forward_s, split.tp_exposed_forward_s / 2, 1e-12 * split.tp_comm_s);
  const plan::GroupTopology tp_group = plan::group_topology(cluster, 2, 1);
  auto all_reduce = [&](double bytes) {
    return plan::collective_time(plan::Collective::AllReduce, bytes, tp_group).seconds;
  };
  EXPECT_NEAR(whole_sp.tp_comm_s,
              split_sp.tp_comm_s / 2 + all_reduce(4 * 8 * h) + 24 * all_reduce(4 * h * f),
              1e-12 * split_sp.tp_comm_s);
  // And the block's weights, whole on each tp rank, are what the rank's gradient reduction and
  // optimizer carry: at ep 4 a quarter of the 8 experts (3 h f each) whole, against half of
  // that split over tp 2.
  const plan::PlanLayout ep4 = plan::parse_layout("tp=2,dp=16,ep=4");
  EXPECT_DOUBLE_EQ(plan::rank_parameters(m, ep4, 0, {}, true).experts,
                   static_cast<double>(m.n_layer) * 2 * 3 * h * f);
  EXPECT_DOUBLE_EQ(plan::rank_parameters(m, ep4, 0, {}, false).experts,
                   static_cast<double>(m.n_layer) * 2 * 3 * h * f / 2);
}

TEST(PlanMoe, LayoutChecksAndTheSearchTriesExpertParallelism) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("dp=8,ep=3"), m, 4096); }),
                  {"8 experts do not split over ep=3"});
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("dp=2,ep=4"), m, 4096); }),
                  {"ep=4 does not divide dp x cp = 2"});
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("dp=8,ep=2"), model_preset("llama-8b"), 4096); }),
                  {"needs a mixture-of-experts model"});
  plan::ClusterSpec cluster;
  cluster.nodes = 2;
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = 4096;
  job.global_batch = 64;
  const plan::SearchResult r = plan::search_layouts(m, cluster, job, 8);
  ASSERT_FALSE(r.ranked.empty());
  bool saw_ep = false;
  for (const plan::Candidate& c : r.ranked) saw_ep = saw_ep || c.layout.ep > 1;
  EXPECT_TRUE(saw_ep);
  // 8B parameters fit nowhere unsharded on one GPU; ep makes the experts fit at 16 GPUs.
  EXPECT_GT(r.ranked.front().layout.ep * r.ranked.front().layout.tp * r.ranked.front().layout.pp, 1);
}

// Dropless MoE on Megatron-Core (host_issue.hpp): the host issues a layer's operations after
// waiting for its token counts, so no pass over the layer is shorter than their issue time.
// Counts by hand: Mixtral (8 experts, every layer MoE) under ep 8 holds 1 expert a rank:
// 40 + 45 + 4 x 1 = 89 operations forward, twice that backward; under ep 1, 40 + 45 + 4 x 8 = 117.
TEST(PlanMoe, TheHostPacesDroplessMegatronMoeLayers) {
  const ModelConfig m = model_preset("mixtral-8x7b");
  const plan::PlanLayout ep8 = plan::parse_layout("dp=32,ep=8,zero=1");
  EXPECT_DOUBLE_EQ(plan::moe_host_forward_ops(m, ep8), 89);
  EXPECT_DOUBLE_EQ(plan::moe_host_forward_ops(m, plan::parse_layout("dp=32,zero=1")), 117);
  ModelConfig dense = m;
  dense.n_experts = dense.experts_per_token = 0;
  EXPECT_DOUBLE_EQ(plan::moe_host_forward_ops(dense, ep8), 0);
  const plan::ClusterSpec cluster = four_nodes();
  plan::TrainingJob job = sequences_of_4096(64);
  const plan::LayerTime device = plan::predict_layer_time(m, ep8, cluster, job);
  // A host far slower than the device: the passes are its issue time exactly.
  job.moe_host_s_per_op = 1.0;
  const plan::LayerTime host = plan::predict_layer_time(m, ep8, cluster, job);
  EXPECT_DOUBLE_EQ(host.forward_s, 89.0);
  EXPECT_DOUBLE_EQ(host.backward_s, 178.0);
  // Full recomputation issues the forward again in backward (and waits for its counts again):
  // (2 + 1) x 89 operations; on half the layers, (2 + 0.5) x 89.
  plan::PlanLayout full = ep8;
  full.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(plan::predict_layer_time(m, full, cluster, job).backward_s, 267.0);
  job.memory.full_recompute_share = 0.5;
  EXPECT_DOUBLE_EQ(plan::predict_layer_time(m, full, cluster, job).backward_s, 222.5);
  job.memory.full_recompute_share = 1.0;
  // A host far faster: the device's time, unchanged.
  job.moe_host_s_per_op = 1e-12;
  EXPECT_EQ(plan::predict_layer_time(m, ep8, cluster, job).forward_s, device.forward_s);
  // The step: two micro-batches of one sequence a rank (64 sequences over dp 32), each through
  // 32 layers of 89 + 178 operations under a 1 s host: at least 2 x 32 x 267 s (the head,
  // optimizer and data-parallel sync add well under 1%).
  job.moe_host_s_per_op = 1.0;
  const plan::StepTime step = plan::predict_step_time(m, ep8, cluster, job);
  EXPECT_GE(step.total_s, 2 * 32 * 267.0);
  EXPECT_LT(step.total_s, 2 * 32 * 267.0 * 1.01);

  // Which published runs: a Megatron-Core stack with a dropless MoE model, not drop-and-pad,
  // not Megatron-Bridge 25.09's token-drop benchmarks, not its full-iteration CUDA graphs.
  auto issue = [&](bool megatron, const ModelConfig& model, const std::string& text, const std::string& source,
                   const std::string& gpu) {
    return plan::published_moe_host_issue(megatron, model, text, source, gpu).seconds_per_op;
  };
  const std::string qwen = "qwen3_30b_a3b", c2602 = "Megatron-Bridge '26.02 NeMo Container' DGX-B200";
  EXPECT_EQ(issue(true, m, qwen, c2602, "b200"), plan::kMoeHostSecondsPerOp);
  EXPECT_EQ(issue(false, m, qwen, c2602, "b200"), 0);
  EXPECT_EQ(issue(true, dense, qwen, c2602, "b200"), 0);
  EXPECT_EQ(issue(true, m, "qwen3_30b_a3b (tokendrop)", c2602, "b200"), 0);
  EXPECT_EQ(issue(true, m, "Qwen3 30B-A3B, Token-Drop", c2602, "b200"), 0);
  ModelConfig capped = m;
  capped.moe_capacity_factor = 1.0;
  EXPECT_EQ(issue(true, capped, qwen, c2602, "b200"), 0);
  const std::string c2509 = "Megatron-Bridge '25.09 NeMo Container' DGX-H100";
  EXPECT_EQ(issue(true, m, qwen, c2509, "h100-sxm"), 0);
  EXPECT_EQ(issue(true, m, "deepseekv3", c2509, "h100-sxm"), plan::kMoeHostSecondsPerOp);
  EXPECT_EQ(issue(true, m, "deepseekv3", c2509, "b200"), 0);
  // Full-iteration graphs: Qwen3-30B-A3B on GB200 from 26.06, on B200 from 26.06.01, never on
  // H100; GPT-OSS never.
  const std::string c2606 = "'26.06 NeMo Container'", c260601 = "'26.06.01 NeMo Container'";
  EXPECT_EQ(issue(true, m, "Qwen3 30B-A3B", c2606, "gb200"), 0);
  EXPECT_EQ(issue(true, m, qwen, c2606, "b200"), plan::kMoeHostSecondsPerOp);
  EXPECT_EQ(issue(true, m, qwen, c260601, "b200"), 0);
  EXPECT_EQ(issue(true, m, qwen, c260601, "h100-sxm"), plan::kMoeHostSecondsPerOp);
  EXPECT_GT(issue(true, m, "gpt_oss_120b", c260601, "gb200"), 0);
  expect_contains(plan::published_moe_host_issue(true, m, qwen, c2602, "b200").assumption,
                  {"dropless MoE on Megatron-Core", "20 us"});
  // A Grace-Blackwell system's Arm host: 1.3 x 20 us = 26 us an operation.
  EXPECT_DOUBLE_EQ(issue(true, m, qwen, c2602, "gb200"), 26e-6);
  EXPECT_DOUBLE_EQ(issue(true, m, qwen, c2602, "gb300"), 26e-6);
  expect_contains(plan::published_moe_host_issue(true, m, qwen, c2602, "gb300").assumption,
                  {"26 us", "Grace"});
}

}  // namespace
}  // namespace loom::test
