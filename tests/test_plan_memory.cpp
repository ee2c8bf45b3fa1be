// The planner's memory model against hand-computed values and against the engine's allocator.
#include <gtest/gtest.h>

#include "loom/core/allocator.hpp"
#include "loom/core/error.hpp"
#include "loom/model/transformer.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/rank_parameters.hpp"
#include "loom/plan/time_model.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using plan::MemoryBreakdown;
using plan::PlanLayout;

double model_states(const MemoryBreakdown& m) { return m.parameters + m.gradients + m.optimizer_state; }

// Rajbhandari et al. (SC'20), Figure 1: 7.5B parameters, 64-way data parallelism, mixed
// precision Adam (K = 12): 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU for stages 0-3.
TEST(PlanMemory, ZeroPaperWorkedExample) {
  const double psi = 7.5e9;
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_NEAR(model_states(plan::zero_model_states(psi, plan::kMixedPrecisionAdam, 64, stage)) / 1e9,
                expected_gb[stage], 0.05)
        << "stage " << stage;
  // The exact terms: stage 1 is 4 psi + 12 psi / 64.
  EXPECT_DOUBLE_EQ(model_states(plan::zero_model_states(psi, plan::kMixedPrecisionAdam, 64, 1)), 4 * psi + 12 * psi / 64);
}

// A GPT-2-style model with h = 1024, f = 4096, 16 heads and 2048-token sequences.
ModelConfig gpt2_layer_1024() {
  ModelConfig m = tiny_gpt2();
  m.n_embd = 1024;
  m.ffn_hidden = 4096;
  m.n_head = m.n_kv_head = 16;
  m.max_seq_len = 2048;
  return m;
}

// A GPT-2-style layer, h = 1024, f = 4096, 16 heads, one sequence of 2048 tokens in bf16.
// Per token: layer input h, two norm outputs (h each) with mean + rstd, the mid residual h
// (4100); q|k|v 3h and the MLP input f (7168); attention output h, 16 log-sum-exps, MLP
// activation f (5136).
TEST(PlanMemory, LayerActivationsByHand) {
  const ModelConfig m = gpt2_layer_1024();
  PlanLayout l;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2), 2048.0 * (4100 + 7168 + 5136) * 2);
  l.tp = 4;  // tensor parallel: only the interiors split
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2), 2048.0 * (4100 + (7168 + 5136) / 4.0) * 2);
  l.sequence_parallel = true;  // and the rest too
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2), 2048.0 * (4100 + 7168 + 5136) / 4.0 * 2);
  l.sequence_parallel = false;
  l.recompute = Recompute::Selective;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2), 2048.0 * (4100 + 7168 / 4.0) * 2);
  l.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2), 2048.0 * 1024 * 2);
  l = PlanLayout{};
  l.cp = 2;  // context parallel: half the sequence per rank
  l.micro_batch = 2;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 2, 2048, l, 2), 2048.0 * (4100 + 7168 + 5136) * 2);
}

// Llama 3.1 8B (Llama 3 Table 3): h = 4096, 32 heads of 128, 8 k|v heads, f = 14336.
ModelConfig llama31_8b() {
  ModelConfig m = tiny_llama();
  m.n_layer = 32;
  m.n_embd = 4096;
  m.n_head = 32;
  m.n_kv_head = 8;
  m.ffn_hidden = 14336;
  m.vocab_size = 128256;
  m.max_seq_len = 8192;
  return m;
}

// torchtitan's per-op selective checkpointing on a Llama 3.1 8B layer, by hand. The policy
// saves wq, wv, w1 (and w2, which backward never reads) and SDPA; the block input is the
// checkpoint's. Per token in bf16: block input 4096, wq 4096, wv 1024, SDPA output 4096, w1
// 14336 = 27,648 elements = 55,296 bytes, plus 32 fp32 log-sum-exps = 128: 55,424 bytes.
// Megatron's selective keeps 4h + 2 + (h + 2 kv + 2f) = 51,202 elements, 102,404 bytes.
TEST(PlanMemory, TorchtitanPerOpSelectiveByHand) {
  const ModelConfig m = llama31_8b();
  PlanLayout l;
  l.recompute = Recompute::Selective;
  l.micro_batch = 2;
  const double tokens = 2 * 8192;
  EXPECT_DOUBLE_EQ(plan::torchtitan_op_sac_layer_bytes(m, 2, 8192, l, 2), tokens * 55424);
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 2, 8192, l, 2), tokens * 102404);
  // tp 2 with sequence parallelism: the block input 4096 / 2; the interiors and the output
  // projection's reduce_scatter output (4096) / 2: (2048 + 27552 / 2) x 2 + 16 x 4 = 31,808.
  PlanLayout tp = l;
  tp.tp = 2;
  tp.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(plan::torchtitan_op_sac_layer_bytes(m, 2, 8192, tp, 2), tokens * 31808);
  // Eager (no torch.compile): w2's output stays too, 4096 more elements a token (55,424 + 8,192
  // bytes); under tp 2 + sp the whole 4096-wide partial sum and its reduce_scatter's 2048
  // (31,808 + 12,288).
  EXPECT_DOUBLE_EQ(plan::torchtitan_op_sac_layer_bytes(m, 2, 8192, l, 2, true), tokens * 63616);
  EXPECT_DOUBLE_EQ(plan::torchtitan_op_sac_layer_bytes(m, 2, 8192, tp, 2, true), tokens * 44096);

  // The whole job of torchtitan's Table 3 (FSDP over 128 GPUs, local batch 2): 32 layers'
  // stashes and the loss buffers, 12 bytes per logit (they outweigh one layer's recomputation,
  // (139,332 - 55,424) bytes per token).
  plan::GpuJob job;
  job.seq_len = 8192;
  job.selective = plan::SelectivePolicy::TorchtitanOps;
  job.logits_bytes_per_element = 12;
  l.dp = 128;
  l.zero_stage = 3;
  PlanLayout none = l;
  none.recompute = Recompute::None;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 2, 8192, none, 2), tokens * 139332);
  EXPECT_DOUBLE_EQ(plan::predict_gpu_memory(m, l, job).activations,
                   tokens * (32 * 55424.0 + 128256 * 12));
  // Under tp 2 (+ sp), PyTorch's loss_parallel holds 16 bytes a logit of the rank's 64,128
  // (GpuJob::logits_bytes_per_element_under_tp), the stashes as above.
  job.logits_bytes_per_element_under_tp = 16;
  PlanLayout tp_dp = tp;
  tp_dp.dp = 64;
  tp_dp.zero_stage = 3;
  EXPECT_DOUBLE_EQ(plan::predict_gpu_memory(m, tp_dp, job).activations,
                   tokens * (32 * 31808.0 + 64128 * 16));
  EXPECT_DOUBLE_EQ(plan::predict_gpu_memory(m, l, job).activations,  // tp 1: its 12 bytes
                   tokens * (32 * 55424.0 + 128256 * 12));
  // Other architectures are refused: the policy counts a dense Llama block's matmuls.
  EXPECT_THROW(plan::torchtitan_op_sac_layer_bytes(gpt2_layer_1024(), 1, 2048, l, 2), Error);
}

// Korthikanti et al. sec. 4.2.3 / Narayanan et al. 2021: L = 32 layers, p = 4, m = 8.
TEST(PlanMemory, PipelineLayersInFlight) {
  ModelConfig m = tiny_llama();
  m.n_layer = 32;
  PlanLayout l;
  l.pp = 4;
  l.schedule = plan::PipelineSchedule::AllForwardAllBackward;
  EXPECT_DOUBLE_EQ(plan::layers_in_flight(m, l, 8), 64);  // all 8 micro-batches of 8 layers
  l.schedule = plan::PipelineSchedule::OneFOneB;
  EXPECT_DOUBLE_EQ(plan::layers_in_flight(m, l, 8), 32);  // p micro-batches: L layers
  EXPECT_DOUBLE_EQ(plan::layers_in_flight(m, l, 2), 16);  // fewer micro-batches than stages
  l.schedule = plan::PipelineSchedule::Interleaved;
  l.vp = 2;
  EXPECT_DOUBLE_EQ(plan::layers_in_flight(m, l, 8), 32 * (1 + 3.0 / 8));
}

// RMSNorm as PyTorch ops (LLaMA's reference `_norm(x.float()).type_as(x) * weight`): autograd
// keeps the fp32 copy of each norm's input (4 bytes an element) and the bf16 rows before the
// weight (2) where a fused kernel keeps the bf16 input (2): 4 bytes more for each of a layer's
// two norms. Its HBM traffic, op by op (forward: float() 6, pow 8, mean 4, the multiply by
// rsqrt 8, type_as 6, the weight's multiply 4; backward: the weight's multiply 12, type_as 6,
// the multiply by rsqrt 24, mean 4, pow 28, the sum of x's two gradients 12, float() 6), is
// 36 bytes an element forward and 92 backward against a fused kernel's 4 and 6. Llama 3 8B
// (h = 4096, 32 layers), one sequence of 2048 at tp 2.
TEST(PlanMemory, UnfusedRmsNormByHand) {
  const ModelConfig m = model_preset("llama-8b");
  plan::GpuJob job;
  job.seq_len = 2048;
  const double h = 4096, rows = 2048, layers = 32;
  auto activations = [&](const char* layout, bool unfused) {
    job.unfused_rmsnorm = unfused;
    return plan::predict_gpu_memory(m, plan::parse_layout(layout), job).activations;
  };
  // Every layer keeps its stash: 2 norms x (4 + 2 - 2) bytes x rows x h, replicated over tp
  // without sp.
  EXPECT_DOUBLE_EQ(activations("tp=2", true) - activations("tp=2", false),
                   layers * 2 * (4 + 2 - 2) * rows * h);
  EXPECT_DOUBLE_EQ(activations("tp=2 sp", true) - activations("tp=2 sp", false),
                   layers * 2 * 4 * rows / 2 * h);
  // Full recomputation keeps layer inputs only; the one layer rebuilt in its backward holds them.
  EXPECT_DOUBLE_EQ(
      activations("tp=2 recompute=full", true) - activations("tp=2 recompute=full", false),
      2 * 4 * rows * h);

  plan::ClusterSpec cluster;
  plan::TrainingJob t;
  t.seq_len = t.memory.seq_len = 2048;
  t.global_batch = 8;
  auto layer = [&](const char* layout, bool unfused) {
    t.memory.unfused_rmsnorm = unfused;
    return plan::predict_layer_time(m, plan::parse_layout(layout), cluster, t);
  };
  const double bandwidth = cluster.gpu.hbm_bandwidth_bytes_per_s;
  const plan::LayerTime fused = layer("tp=2", false), unfused = layer("tp=2", true);
  EXPECT_NEAR(unfused.forward_s - fused.forward_s,
              2 * rows * h * (6 + 8 + 4 + 8 + 6 + 4 - 4) / bandwidth, 1e-12);
  EXPECT_NEAR(unfused.backward_s - fused.backward_s,
              2 * rows * h * (12 + 6 + 24 + 4 + 28 + 12 + 6 - 6) / bandwidth, 1e-12);
  // GPT-2's LayerNorm is one PyTorch op: nothing changes.
  const ModelConfig gpt2 = model_preset("gpt2-124m");
  job.unfused_rmsnorm = true;
  const double with = plan::predict_gpu_memory(gpt2, plan::parse_layout("tp=2"), job).activations;
  job.unfused_rmsnorm = false;
  EXPECT_EQ(with, plan::predict_gpu_memory(gpt2, plan::parse_layout("tp=2"), job).activations);
}

// Materialised attention as PyTorch ops, LLaMA's reference (`softmax(scores.float()).type_as(xq)`
// between two matmuls, the scores scaled and masked on the way), counted op by op in bytes a
// score: forward, QK^T writes 2, the division 2 + 2, the mask's add 2 + 2, float() 2 + 4, softmax
// 4 + 4, type_as 4 + 2, PV reads 2 = 32; backward, PV's gradient writes dP and reads P (2 + 2),
// type_as's 2 + 4, softmax's 4 + 4 + 4, float()'s 4 + 2, the division's 2 + 2, QK^T's gradients
// read dS twice (2 + 2) = 36; against the fused scale-mask-softmax and dropout's 13 and 19.
// Autograd keeps the fp32 probabilities (4) and their bf16 copy (2): one byte a score more than
// the fused kernels' 5. Llama 3 8B (32 heads), one sequence of 2048 at tp 2.
TEST(PlanMemory, UnfusedSoftmaxByHand) {
  const ModelConfig m = model_preset("llama-8b");
  const double scores = 2048.0 * (32 / 2) * 2048, layers = 32;
  plan::GpuJob job;
  job.seq_len = 2048;
  job.flash_attention = false;
  auto activations = [&](const char* layout, bool unfused) {
    job.unfused_softmax = unfused;
    return plan::predict_gpu_memory(m, plan::parse_layout(layout), job).activations;
  };
  EXPECT_DOUBLE_EQ(activations("tp=2", true) - activations("tp=2", false), layers * 1 * scores);
  EXPECT_DOUBLE_EQ(activations("tp=2 recompute=selective", true),
                   activations("tp=2 recompute=selective", false));  // no scores kept
  // Full recomputation: the one layer rebuilt in its backward holds its scores.
  EXPECT_DOUBLE_EQ(
      activations("tp=2 recompute=full", true) - activations("tp=2 recompute=full", false), scores);

  plan::ClusterSpec cluster;
  plan::TrainingJob t;
  t.seq_len = t.memory.seq_len = 2048;
  t.global_batch = 8;
  t.memory.flash_attention = false;
  auto layer = [&](bool unfused) {
    t.memory.unfused_softmax = unfused;
    return plan::predict_layer_time(m, plan::parse_layout("tp=2"), cluster, t);
  };
  const double bandwidth = cluster.gpu.hbm_bandwidth_bytes_per_s;
  const plan::LayerTime fused = layer(false), unfused = layer(true);
  EXPECT_NEAR(unfused.forward_s - fused.forward_s, (32 - 13) * scores / bandwidth, 1e-12);
  EXPECT_NEAR(unfused.backward_s - fused.backward_s, (36 - 19) * scores / bandwidth, 1e-12);
  // Flash attention keeps no scores: the flag changes nothing.
  t.memory.flash_attention = job.flash_attention = true;
  EXPECT_DOUBLE_EQ(layer(true).forward_s, layer(false).forward_s);
  EXPECT_DOUBLE_EQ(activations("tp=2", true), activations("tp=2", false));
}

// Logits gathered over tp before the loss (GpuJob::logits_gathered_over_tp): every tp rank holds
// tokens x V logits' bytes, not tokens x V / tp. By hand for Llama 3 8B (V = 128,256), one
// sequence of 2048 at tp 4, 14 bytes a logit (Hagemann et al.'s framework).
TEST(PlanMemory, GatheredLogitsHoldTheWholeVocabularyOnEveryTpRank) {
  const ModelConfig m = model_preset("llama-8b");
  plan::GpuJob job;
  job.seq_len = 2048;
  job.logits_bytes_per_element = 14;
  auto activations = [&](bool gathered) {
    job.logits_gathered_over_tp = gathered;
    return plan::predict_gpu_memory(m, plan::parse_layout("tp=4"), job).activations;
  };
  ASSERT_EQ(m.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(activations(true) - activations(false), 2048.0 * 128256 * 14 * (1 - 1.0 / 4));
}

TEST(PlanMemory, LayoutsParseAndImpossibleOnesSayWhy) {
  const PlanLayout l = plan::parse_layout("tp=2, pp=4,dp=8,zero=1,mbs=2,recompute=selective,sp=1,v=2");
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 4);
  EXPECT_EQ(l.vp, 2);
  EXPECT_EQ(l.dp, 8);
  EXPECT_EQ(l.zero_stage, 1);
  EXPECT_EQ(l.micro_batch, 2);
  EXPECT_EQ(l.recompute, Recompute::Selective);
  EXPECT_TRUE(l.sequence_parallel);
  EXPECT_EQ(l.schedule, plan::PipelineSchedule::Interleaved);
  EXPECT_EQ(l.gpus(), 64);
  expect_contains(error_message([] { plan::parse_layout("tp=0"); }), {"tp=0"});
  expect_contains(error_message([] { plan::parse_layout("zero=x"); }), {"zero=x"});
  expect_contains(error_message([] { plan::parse_layout("dp=2,tensor=4"); }), {"tensor"});
  const ModelConfig llama = tiny_llama();  // 4 heads, 2 KV heads, 2 layers, FFN 48
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("tp=3"), llama, 16); }), {"4 attention heads", "tp=3"});
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("pp=4"), llama, 16); }), {"2 layers", "pp x v = 4"});
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("sp=1"), llama, 16); }), {"sequence parallelism needs tp"});
  expect_contains(error_message([&] { plan::check_layout(plan::parse_layout("ep=2"), llama, 16); }), {"mixture-of-experts"});
  EXPECT_NO_THROW(plan::check_layout(plan::parse_layout("tp=2,pp=2,sp=1,zero=3"), llama, 16));
}

// FSDP2 under pipelining (torchtitan): each rank also holds its stage's parameters gathered (2
// bytes each in bf16) and their gradients unsharded in fp32 (4). tiny_llama on pp 2, by hand:
// rank 0 holds the embedding (64 x 32) and layer 0 (norms 64, q and o 2 x 32 x 32, k and v 2 x
// 32 x 16, MLP 3 x 32 x 48: 7744), 9792; rank 1 layer 1, the final norm and the head, 9824.
// Nothing changes without pipelining, without ZeRO-3, or with one data-parallel rank.
TEST(PlanMemory, FsdpUnderPipeliningHoldsTheStageGathered) {
  const ModelConfig m = tiny_llama();
  plan::GpuJob job;
  job.seq_len = 16;
  job.micro_batches = 4;
  auto extra = [&](const std::string& layout) {
    plan::GpuJob gathered = job;
    gathered.fsdp_gathered_under_pp = true;
    const PlanLayout l = plan::parse_layout(layout);
    const MemoryBreakdown a = plan::predict_gpu_memory(m, l, job),
                          b = plan::predict_gpu_memory(m, l, gathered);
    EXPECT_DOUBLE_EQ(b.optimizer_state, a.optimizer_state) << layout;
    EXPECT_DOUBLE_EQ(b.activations, a.activations) << layout;
    EXPECT_DOUBLE_EQ(2 * (b.gradients - a.gradients), 4 * (b.parameters - a.parameters)) << layout;
    return (b.parameters - a.parameters) / 2;
  };
  const double held = extra("pp=2 dp=2 zero=3");
  EXPECT_TRUE(held == 9792 || held == 9824) << held;
  EXPECT_EQ(extra("pp=2 dp=2 zero=1"), 0);
  EXPECT_EQ(extra("dp=2 zero=3"), 0);
  EXPECT_EQ(extra("pp=2 zero=3"), 0);
  // Its traffic: each layer gathered once a step and its gradients reduce-scattered once, where
  // ZeRO-3 otherwise gathers twice (forward, backward) and reduce-scatters once per micro-batch:
  // m layers x (2 ag + rs) against layers x (ag + rs), which lies between half and all of
  // layers x (2 ag + rs).
  plan::ClusterSpec cluster;
  cluster.gpus_per_node = 4;
  cluster.nodes = 1;
  plan::TrainingJob t;
  t.seq_len = t.memory.seq_len = 16;
  t.global_batch = 16;
  const PlanLayout l = plan::parse_layout("pp=2 dp=2 zero=3 mbs=1");
  const int64_t micro = 16 / 2;
  const double per_micro = plan::predict_step_time(m, l, cluster, t).dp_comm_s / micro;
  t.memory.fsdp_gathered_under_pp = true;
  const double once = plan::predict_step_time(m, l, cluster, t).dp_comm_s;
  EXPECT_GT(per_micro, 0);
  EXPECT_LT(once, per_micro);
  EXPECT_GT(once, per_micro / 2);
}

// One process: the planner's engine figures equal the allocator's bytes, to the byte.
TEST(PlanMemory, EngineFiguresEqualTheAllocator) {
  for (const bool bf16 : {false, true}) {
    ModelConfig mixtral = tiny_llama();  // 4 experts, 2 per token, 1 shared: the MoE stash as well
    mixtral.n_experts = 4;
    mixtral.experts_per_token = 2;
    mixtral.n_shared_experts = 1;  // and a shared expert
    // DeepSeek's shapes: narrower experts after a dense first layer; a MoE layer then a dense one.
    ModelConfig first_dense = mixtral, moe_then_dense = mixtral;
    first_dense.moe_ffn_hidden = moe_then_dense.moe_ffn_hidden = 12;
    first_dense.moe_first_dense = 1;
    moe_then_dense.moe_every = 2;
    ModelConfig wide_heads = tiny_llama();  // q and the attention output 48 wide on a 32 stream
    wide_heads.attention_head_dim = 12;
    ModelConfig wide_moe = mixtral;  // and with experts (the MoE stash's attention output)
    wide_moe.attention_head_dim = 12;
    for (const ModelConfig& config :
         {tiny_gpt2(), tiny_llama(), mixtral, first_dense, moe_then_dense, wide_heads, wide_moe}) {
      for (const Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        const MemStats before = HostAllocator::instance().stats();
        Transformer model(config, recompute);
        AdamW optimizer(model.parameters(), {}, bf16);
        const auto tokens = random_tokens(3 * 16, config.vocab_size, 5);
        model.forward(tokens.data(), tokens.data(), 3, 16, {true, 1.0f});
        const MemStats after = HostAllocator::instance().stats();
        auto live = [&](MemCategory c) {
          return static_cast<double>(after.live_bytes[static_cast<size_t>(c)] - before.live_bytes[static_cast<size_t>(c)]);
        };
        const MemoryBreakdown predicted = plan::predict_engine_memory(config, 1, 0, 25'000'000, bf16, 3, 16, recompute);
        const std::string what =
            std::string(architecture_name(config.arch)) + (config.is_moe() ? " moe " : " ") +
            std::to_string(config.moe_first_dense) + "/" + std::to_string(config.moe_every) +
            " head " + std::to_string(config.head_dim()) + " " + recompute_name(recompute) +
            (bf16 ? " bf16" : "");
        EXPECT_EQ(predicted.parameters, live(MemCategory::Parameters)) << what;
        EXPECT_EQ(predicted.gradients, live(MemCategory::Gradients)) << what;
        EXPECT_EQ(predicted.optimizer_state, live(MemCategory::OptimizerState)) << what;
        EXPECT_EQ(predicted.activations, live(MemCategory::Activations)) << what;  // the issue asks 10%
        // A second micro-batch through the same stashes peaks at the same bytes: a MoE stash,
        // sized by its routing, frees the last one's buffers before it allocates (else its
        // widest buffer, the experts' gate | up rows, is held twice on the way).
        HostAllocator::instance().reset_peaks();
        model.forward(tokens.data(), tokens.data(), 3, 16, {true, 1.0f});
        const MemStats again = HostAllocator::instance().stats();
        EXPECT_EQ(
            predicted.activations,
            static_cast<double>(again.peak_bytes[static_cast<size_t>(MemCategory::Activations)] -
                                before.live_bytes[static_cast<size_t>(MemCategory::Activations)]))
            << what;
      }
    }
  }
}

// Under expert parallelism a busier rank holds its extra received rows, each the expert's input,
// gate | up and SwiGLU output (h + 3 fe f32), and nothing else grows; without ep every row is
// local and the factor does not apply. By hand: 3 x 16 tokens, k = 2, h = 32, fe = 48.
TEST(PlanMemory, EngineExpertActivationsGrowWithTheBusiestRanksRows) {
  ModelConfig m = tiny_llama();
  m.n_experts = 4;
  m.experts_per_token = 2;
  ASSERT_EQ(m.n_embd, 32);
  ASSERT_EQ(m.expert_ffn(), 48);
  auto activations = [&](int64_t ep, double imbalance) {
    return plan::predict_engine_memory(m, 2, 0, 25'000'000, false, 3, 16, Recompute::None, 1, false,
                                       1, ep, imbalance)
        .activations;
  };
  const double tokens = 3 * 16, extra_rows = 0.5 * 2 * tokens;
  EXPECT_DOUBLE_EQ(activations(2, 1.5) - activations(2, 1.0),
                   4 * extra_rows * (32 + 3 * 48) * static_cast<double>(m.n_layer));
  EXPECT_DOUBLE_EQ(activations(1, 1.5), activations(1, 1.0));
  EXPECT_DOUBLE_EQ(activations(2, 1.0), activations(1, 1.0));
  expect_contains(error_message([&] { activations(2, 0.9); }), {"moe_imbalance", ">= 1"});
}

TEST(PlanMemory, GpuPredictionShrinksWithEachShardingDimension) {
  const ModelConfig llama8b = model_preset("llama-8b");
  plan::GpuJob job;
  job.seq_len = 4096;
  job.micro_batches = 8;
  auto total = [&](const std::string& layout) {
    const PlanLayout l = plan::parse_layout(layout);
    plan::check_layout(l, llama8b, job.seq_len);
    return plan::predict_gpu_memory(llama8b, l, job).total();
  };
  EXPECT_GT(total("dp=8"), total("dp=8,zero=1"));
  EXPECT_GT(total("dp=8,zero=1"), total("dp=8,zero=3"));
  EXPECT_GT(total("tp=1,dp=8"), total("tp=8"));
  EXPECT_GT(total("tp=8"), total("tp=8,sp=1"));
  EXPECT_GT(total("pp=4,dp=2,schedule=afab"), total("pp=4,dp=2"));
  EXPECT_GT(total("dp=8"), total("dp=8,recompute=selective"));
  EXPECT_GT(total("dp=8,recompute=selective"), total("dp=8,recompute=full"));
  // 8B parameters in mixed precision need 16 bytes each without sharding: about 128 GB.
  const MemoryBreakdown plain = plan::predict_gpu_memory(llama8b, plan::parse_layout("dp=8"), job);
  EXPECT_NEAR(model_states(plain) / 1e9, 16.0 * static_cast<double>(llama8b.parameter_count()) / 1e9, 1.0);
}


// Each rank's parameters come from the parameter list's placement: the ranks of a pipeline
// hold the whole model once (plus the last stage's copy of a tied table), the first stages
// take the extra layers of an uneven split, and tp splits all but norms and row-parallel biases.
TEST(PlanMemory, RankParametersFollowEachParametersPlacement) {
  const ModelConfig llama = model_preset("llama-8b");  // untied, 32 layers
  const auto total = static_cast<double>(llama.parameter_count());
  EXPECT_DOUBLE_EQ(plan::rank_parameters(llama, plan::parse_layout("dp=8"), 0).total(), total);
  double sum = 0;
  for (int64_t rank = 0; rank < 4; ++rank) sum += plan::rank_parameters(llama, plan::parse_layout("pp=4"), rank).total();
  EXPECT_DOUBLE_EQ(sum, total);
  const ModelConfig gpt2 = model_preset("gpt2-124m");  // tied: the last stage holds a copy
  const double table = static_cast<double>(gpt2.vocab_size * gpt2.n_embd);
  EXPECT_DOUBLE_EQ(plan::rank_parameters(gpt2, plan::parse_layout("pp=2"), 0).total() +
                       plan::rank_parameters(gpt2, plan::parse_layout("pp=2"), 1).total(),
                   static_cast<double>(gpt2.parameter_count()) + table);
  // 12 layers over 5 stages: 3, 3, 2, 2, 2 (stage_layer_counts).
  EXPECT_EQ(plan::rank_parameters(gpt2, plan::parse_layout("pp=5"), 0).layers, 3);
  EXPECT_EQ(plan::rank_parameters(gpt2, plan::parse_layout("pp=5"), 4).layers, 2);
  EXPECT_EQ(plan::heaviest_rank_parameters(gpt2, plan::parse_layout("pp=5")).layers, 3);
  // tp = 4: a llama block is all linear weights but its two norms.
  const plan::RankParameters one = plan::rank_parameters(llama, plan::parse_layout("pp=4"), 1);
  const plan::RankParameters split = plan::rank_parameters(llama, plan::parse_layout("tp=4 pp=4"), 1);
  const double norms = 2.0 * static_cast<double>(llama.n_embd) * static_cast<double>(one.layers);
  EXPECT_DOUBLE_EQ(split.block, (one.block - norms) / 4 + norms);
}

// FP8 (Transformer Engine): each Linear saves the FP8 cast of its input, 1 byte instead of 2.
// The layer of LayerActivationsByHand (h 1024, f 4096) has 2h = 2048 norm outputs (q|k|v and
// MLP inputs) and h + f = 5120 attention outputs and MLP activations among its Linear inputs.
TEST(PlanMemory, Fp8LinearInputsTakeOneByte) {
  const ModelConfig m = gpt2_layer_1024();
  PlanLayout l;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2, true, true),
                   2048.0 * ((4100 + 7168 + 5136) * 2 - 7168));
  l.recompute = Recompute::Selective;  // the attention output and MLP activation are recomputed
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2, true, true),
                   2048.0 * ((4100 + 7168) * 2 - 2048));
  l.recompute = Recompute::None;
  l.tp = 4;
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2, true, true),
                   2048.0 * ((4100 + 7168 + 5136) * 2 - 7168) / 4);
  l.recompute = Recompute::Full;  // the layer input, kept in 16 bits
  EXPECT_DOUBLE_EQ(plan::layer_activation_bytes(m, 1, 2048, l, 2, true, true),
                   2048.0 * 1024 * 2 / 4);
}

}  // namespace
}  // namespace loom::test
