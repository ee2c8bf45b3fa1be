// The time model's communication under framework conventions a published source's code shows
// (TrainingJob::dp_sync_after_backward, tp_reduce_per_column_linear) and under full
// recomputation, each against collective_time's own price of the collectives counted by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "loom/model/config.hpp"
#include "loom/model/flops.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layer_cost.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/time_model.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

// DGX A100 nodes (8 GPUs, NVLink inside, the preset's network between).
plan::ClusterSpec a100_nodes(int64_t nodes) {
  plan::ClusterSpec cluster;
  cluster.gpu = plan::gpu_preset("a100-80gb");
  cluster.gpus_per_node = 8;
  cluster.nodes = nodes;
  cluster.inter_node_bytes_per_s_per_gpu = plan::default_inter_node_bytes_per_s(cluster.gpu);
  return cluster;
}

plan::TrainingJob job_of(int64_t seq_len, int64_t global_batch) {
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = seq_len;
  job.global_batch = global_batch;
  return job;
}

// A framework that synchronises data parallelism in its optimizer step (Aleph Alpha's, which ran
// Hagemann et al.'s sweeps: every gradient all-reduced in fp32 after the backward, the updated
// 16-bit parameters all-gathered after the update) exposes both collectives whole. By hand for
// GPT-2 124M on dp 16 over two 8-GPU A100 nodes: the all-reduce of 4 bytes a parameter plus,
// under ZeRO-1, the all-gather of 2, each as collective_time prices it; without ZeRO no gather.
TEST(PlanTime, DataParallelSyncAfterTheBackwardIsExposedWhole) {
  const ModelConfig m = model_preset("gpt2-124m");
  const plan::ClusterSpec cluster = a100_nodes(2);
  plan::TrainingJob job = job_of(1024, 64);
  const double params = static_cast<double>(m.parameter_count());
  const plan::GroupTopology group = plan::group_topology(cluster, 16, 1);
  const double all_reduce =
      plan::collective_time(plan::Collective::AllReduce, 4 * params, group).seconds;
  const double all_gather =
      plan::collective_time(plan::Collective::AllGather, 2 * params, group).seconds;
  for (const int zero : {0, 1}) {
    SCOPED_TRACE(zero);
    const plan::PlanLayout l = plan::parse_layout("dp=16 mbs=1 zero=" + std::to_string(zero));
    job.dp_sync_after_backward = false;
    const plan::StepTime overlapped = plan::predict_step_time(m, l, cluster, job);
    job.dp_sync_after_backward = true;
    const plan::StepTime after = plan::predict_step_time(m, l, cluster, job);
    const double expected = all_reduce + (zero == 1 ? all_gather : 0.0);
    EXPECT_NEAR(after.dp_comm_s, expected, 1e-12);
    EXPECT_NEAR(after.exposed_comm_s, expected, 1e-12);  // nothing else is exposed at tp 1
    EXPECT_NEAR(after.total_s - overlapped.total_s, expected - overlapped.exposed_comm_s, 1e-12);
    EXPECT_LT(overlapped.exposed_comm_s, expected);
  }
  // ZeRO-3's per-layer gathers are another path: the flag leaves them alone.
  const plan::PlanLayout zero3 = plan::parse_layout("dp=16 mbs=1 zero=3");
  job.dp_sync_after_backward = false;
  const double fsdp = plan::predict_step_time(m, zero3, cluster, job).total_s;
  job.dp_sync_after_backward = true;
  EXPECT_DOUBLE_EQ(plan::predict_step_time(m, zero3, cluster, job).total_s, fsdp);
}

// The same framework reduces each column-parallel linear's input gradient apart, and its SwiGLU
// gate and up are two linears: without sequence parallelism a Llama layer's backward makes three
// all-reduces of [tokens, h] (2 bytes each), Megatron-LM's two; forward two either way. By hand
// at tp 4 in one node; GPT-2's MLP is one linear, and sequence parallelism is Megatron's path.
TEST(PlanTime, ColumnLinearsReducingApartAddABackwardAllReduce) {
  const plan::ClusterSpec cluster = a100_nodes(1);
  plan::TrainingJob job = job_of(2048, 8);  // 8 micro-batches of one sequence at dp 1
  const plan::GroupTopology group = plan::group_topology(cluster, 4, 1);
  auto step = [&](const ModelConfig& m, const char* layout, bool apart) {
    job.tp_reduce_per_column_linear = apart;
    return plan::predict_step_time(m, plan::parse_layout(layout), cluster, job);
  };
  auto layer = [&](const ModelConfig& m, const char* layout, bool apart) {
    job.tp_reduce_per_column_linear = apart;
    return plan::predict_layer_time(m, plan::parse_layout(layout), cluster, job);
  };
  const ModelConfig llama = model_preset("llama-8b"), gpt2 = model_preset("gpt2-124m");
  const double one =
      plan::collective_time(plan::Collective::AllReduce, 2048.0 * 4096 * 2, group).seconds;
  const double calls = 8.0 * static_cast<double>(llama.n_layer);
  EXPECT_NEAR(step(llama, "tp=4", false).tp_comm_s, calls * 4 * one, 1e-9);
  EXPECT_NEAR(step(llama, "tp=4", true).tp_comm_s, calls * 5 * one, 1e-9);
  const plan::LayerTime megatron = layer(llama, "tp=4", false), apart = layer(llama, "tp=4", true);
  EXPECT_NEAR(apart.backward_s - megatron.backward_s, one, 1e-12);  // exposed: no overlap
  EXPECT_NEAR(apart.forward_s, megatron.forward_s, 1e-12);
  EXPECT_DOUBLE_EQ(step(gpt2, "tp=4", true).tp_comm_s, step(gpt2, "tp=4", false).tp_comm_s);
  EXPECT_DOUBLE_EQ(step(llama, "tp=4 sp", true).tp_comm_s, step(llama, "tp=4 sp", false).tp_comm_s);
  // Mixtral's layers are all experts, each whole on every tp rank: no third all-reduce.
  const ModelConfig mixtral = model_preset("mixtral-8x7b");
  ASSERT_EQ(mixtral.moe_layer_count(), mixtral.n_layer);
  EXPECT_DOUBLE_EQ(step(mixtral, "tp=4", true).tp_comm_s, step(mixtral, "tp=4", false).tp_comm_s);
  // Full recomputation reruns each layer's forward in its backward, the forward's two
  // all-reduces with it: 6 a layer (7 with the gated MLP's reduced apart), exposed in backward.
  EXPECT_NEAR(step(llama, "tp=4 recompute=full", false).tp_comm_s, calls * 6 * one, 1e-9);
  EXPECT_NEAR(step(llama, "tp=4 recompute=full", true).tp_comm_s, calls * 7 * one, 1e-9);
  const plan::LayerTime full = layer(llama, "tp=4 recompute=full", false);
  const plan::LayerTime none = layer(llama, "tp=4", false);
  EXPECT_NEAR(full.backward_s - none.backward_s, none.forward_s,
              1e-12);  // the forward again, comm included
}

// The same framework gathers the head's logits over tp and runs the loss over the whole
// vocabulary in fp32 on every rank (GpuJob::logits_gathered_over_tp): the step grows by the
// all-gather of tokens x V bf16 logits as collective_time prices it plus 18 + 26 bytes a logit of
// HBM traffic, per micro-batch, by hand. GPT-2 124M (V = 50257) at tp 2 in one A100 node, one
// sequence of 1024 per micro-batch, 4 micro-batches on one rank (pp 1).
TEST(PlanTime, AHeadGatheredOverTpChargesTheGatherAndTheWholeVocabularyLoss) {
  const ModelConfig m = model_preset("gpt2-124m");
  const plan::ClusterSpec cluster = a100_nodes(1);
  plan::TrainingJob job = job_of(1024, 4);
  const plan::PlanLayout l = plan::parse_layout("tp=2 dp=1 mbs=1");
  const plan::StepTime sharded = plan::predict_step_time(m, l, cluster, job);
  job.memory.logits_gathered_over_tp = true;
  const plan::StepTime gathered = plan::predict_step_time(m, l, cluster, job);
  const double logits = 1024.0 * 50257;
  const double gather = plan::collective_time(plan::Collective::AllGather, 2 * logits,
                                              plan::group_topology(cluster, 2, 1))
                            .seconds;
  const double per_micro = gather + 44 * logits / cluster.gpu.hbm_bandwidth_bytes_per_s;
  EXPECT_NEAR(gathered.total_s - sharded.total_s, 4 * per_micro, 1e-9 * gathered.total_s);
}

// MXFP8 GEMMs run at the block-scaled kernels' rate that Transformer Engine's GEMM profiling guide
// measured on a B300 against per-tensor FP8's (6.812 ms and 7.161 ms for one layer's twelve GEMMs,
// inputs quantised beforehand): every linear GEMM takes 7.161 / 6.812 of its FP8 time, and
// nothing else changes (the casts, attention, the memory-bound work).
TEST(PlanTime, MxfpGemmsRunAtTheBlockScaledKernelsMeasuredRate) {
  const ModelConfig m = model_preset("llama-8b");
  plan::ClusterSpec cluster;
  cluster.gpu = plan::gpu_preset("b200");
  cluster.gpus_per_node = 8;
  cluster.nodes = 1;
  cluster.inter_node_bytes_per_s_per_gpu = plan::default_inter_node_bytes_per_s(cluster.gpu);
  plan::TrainingJob job = job_of(4096, 64);
  job.fp8_gemms = true;
  const plan::PlanLayout l = plan::parse_layout("dp=8 mbs=2 zero=1");
  const plan::GemmEfficiency gemm = plan::default_gemm_efficiency(cluster.gpu);
  const plan::LayerCost fp8 = plan::layer_cost(m, l, cluster, job, gemm);
  job.mx_gemms = true;
  const plan::LayerCost mx = plan::layer_cost(m, l, cluster, job, gemm);
  const double slower = 7.161 / 6.812;
  EXPECT_NEAR(mx.weight_grad_s / fp8.weight_grad_s, slower, 1e-12);  // the forward's GEMMs
  // Forward: the linear GEMMs once; backward: twice (input and weight gradients).
  EXPECT_NEAR(mx.forward_s - fp8.forward_s, (slower - 1) * fp8.weight_grad_s, 1e-15);
  EXPECT_NEAR(mx.backward_s - fp8.backward_s, 2 * (slower - 1) * fp8.weight_grad_s, 1e-15);
  EXPECT_DOUBLE_EQ(mx.attention_core_s, fp8.attention_core_s);
}

// Megatron-LM's asynchronous tp backward: each column-parallel linear's input-gradient all-reduce
// runs beside that linear's own gradient GEMMs, half the layer's input- and weight-gradient
// GEMMs (2 x linear_forward / 2 each), so only what outlasts them is exposed: by hand
// 2 x max(0, all-reduce - linear_forward), against two all-reduces in full without it; the
// forward is unchanged. Korthikanti et al.'s 22B layer at tp 8 (mbs 4, sequences of 2048) hides
// them whole; a layer of 1/16 the tokens on a 10 GB/s link does not.
TEST(PlanTime, AsyncTpBackwardHidesTheAllReducesBehindTheGradientGemms) {
  ModelConfig m = model_preset("gpt2-124m");
  m.n_layer = 48;
  m.n_embd = 6144;
  m.n_head = m.n_kv_head = 64;
  m.ffn_hidden = 4 * 6144;
  plan::ClusterSpec cluster = a100_nodes(1);
  const plan::GemmEfficiency gemm = plan::default_gemm_efficiency(cluster.gpu);
  for (const int64_t mbs : {4, 1}) {
    SCOPED_TRACE(mbs);
    if (mbs == 1) cluster.gpu.nvlink_bytes_per_s = 10e9;
    plan::TrainingJob job = job_of(mbs == 4 ? 2048 : 512, 8);
    const plan::PlanLayout l =
        plan::parse_layout("tp=8 mbs=" + std::to_string(mbs) + " recompute=none");
    const plan::LayerCost sync = plan::layer_cost(m, l, cluster, job, gemm);
    job.tp_async_backward = true;
    const plan::LayerCost async = plan::layer_cost(m, l, cluster, job, gemm);
    const double tokens = static_cast<double>(mbs * job.seq_len);
    const double all_reduce = plan::collective_time(plan::Collective::AllReduce, tokens * 6144 * 2,
                                                    plan::group_topology(cluster, 8, 1))
                                  .seconds;
    EXPECT_NEAR(sync.tp_exposed_backward_s, 2 * all_reduce, 1e-12);
    EXPECT_NEAR(async.tp_exposed_backward_s, 2 * std::max(0.0, all_reduce - async.weight_grad_s),
                1e-12);
    EXPECT_DOUBLE_EQ(async.tp_exposed_forward_s, sync.tp_exposed_forward_s);
    // A frozen base (LoRA) has only the input-gradient GEMMs to hide them behind, half as long.
    job.frozen_base = true;
    const plan::LayerCost frozen = plan::layer_cost(m, l, cluster, job, gemm);
    job.frozen_base = false;
    EXPECT_NEAR(frozen.tp_exposed_backward_s,
                2 * std::max(0.0, all_reduce - async.weight_grad_s / 2), 1e-12);
    if (mbs == 4) {
      EXPECT_EQ(async.tp_exposed_backward_s, 0.0);
    } else {
      EXPECT_GT(async.tp_exposed_backward_s, 0.0);
    }
  }
}

// LoRA's frozen base (TrainingJob::frozen_base) drops every weight-gradient GEMM: a layer's
// backward loses exactly its W (the forward's linear GEMMs, c.weight_grad_s of the full run) and
// W is empty; the head's backward loses one of its two products; no gradient is reduced over dp
// and no optimizer steps; MFU counts 4 of training's 6 FLOPs a parameter. By hand for GPT-2 124M
// on dp 16 over two A100 nodes, ZeRO-1: the step is the full one less those, to 1e-12.
TEST(PlanTime, AFrozenBaseComputesInputGradientsOnly) {
  const ModelConfig m = model_preset("gpt2-124m");
  const plan::ClusterSpec cluster = a100_nodes(2);
  const plan::GemmEfficiency gemm = plan::default_gemm_efficiency(cluster.gpu);
  plan::TrainingJob job = job_of(1024, 64);
  const plan::PlanLayout l = plan::parse_layout("dp=16 mbs=1 zero=1 recompute=none");
  const plan::LayerCost full = plan::layer_cost(m, l, cluster, job, gemm);
  const plan::StepTime full_step = plan::predict_step_time(m, l, cluster, job);
  job.frozen_base = true;
  const plan::LayerCost lora = plan::layer_cost(m, l, cluster, job, gemm);
  const plan::StepTime lora_step = plan::predict_step_time(m, l, cluster, job);
  EXPECT_GT(full.weight_grad_s, 0);
  EXPECT_EQ(lora.weight_grad_s, 0);
  EXPECT_NEAR(full.backward_s - lora.backward_s, full.weight_grad_s, 1e-15);
  EXPECT_DOUBLE_EQ(lora.forward_s, full.forward_s);
  EXPECT_EQ(lora_step.dp_comm_s, 0);
  EXPECT_EQ(lora_step.optimizer_s, 0);
  EXPECT_GT(full_step.optimizer_s, 0);
  // 4 micro-batches of 12 layers each lose their W, the head its weight-gradient GEMM
  // (2 x tokens x h x V at the GEMM rate of its shape).
  const double tokens = 1024, h = 768, v = static_cast<double>(m.vocab_size);
  const double head_gemm =
      2 * tokens * h * v / (cluster.gpu.bf16_tflops * 1e12 * gemm.efficiency(tokens, v, h));
  EXPECT_NEAR(full_step.compute_s - lora_step.compute_s, 4 * (12 * full.weight_grad_s + head_gemm),
              1e-9 * full_step.compute_s);
  // ZeRO-3 still gathers each layer for its forward and its backward; only the reduce-scatter of
  // its gradients goes: 4 micro-batches x 12 layers of 12h^2 + 13h parameters, 2-byte gradients.
  const plan::PlanLayout zero3 = plan::parse_layout("dp=16 mbs=1 zero=3 recompute=none");
  const double rs =
      plan::collective_time(plan::Collective::ReduceScatter, (12 * h * h + 13 * h) * 2,
                            plan::group_topology(cluster, 16, 1))
          .seconds;
  const double frozen3 = plan::predict_step_time(m, zero3, cluster, job).dp_comm_s;
  job.frozen_base = false;
  const double full3 = plan::predict_step_time(m, zero3, cluster, job).dp_comm_s;
  job.frozen_base = true;
  EXPECT_GT(frozen3, 0);
  EXPECT_NEAR(full3 - frozen3, 4 * 12 * rs, 1e-12);
  EXPECT_NEAR(lora_step.mfu,
              4.0 / 6.0 * flops_per_token(m, 1024) * 64 * 1024 /
                  (lora_step.total_s * 16 * cluster.gpu.bf16_tflops * 1e12),
              1e-12);
}

// A part's GEMM and fused-attention rates are the H100's shares scaled by its measured
// matmul ceiling over its peak against the H100's (Bekman's MAMF table: H100 SXM 794.5 of 989,
// 80.3%; B200 77.6%; GB200 72.9%, its 1,822 of 2,500 TFLOP/s; GH200 144 GB 83.8%): by hand,
// GB200 0.60 x 0.729 / 0.803 = 0.5447. A part with no measurement (H800) keeps the H100's
// shares, and a run's stated or power-limited peak (GpuSpec::bf16_tflops changed) does not
// change the share of it.
TEST(PlanTime, GemmRatesScaleWithAPartsMeasuredShareOfItsPeak) {
  auto gemm = [](const plan::GpuSpec& gpu) {
    return plan::default_gemm_efficiency(gpu).peak_fraction;
  };
  EXPECT_DOUBLE_EQ(gemm(plan::gpu_preset("h100-sxm")), 0.60);
  EXPECT_DOUBLE_EQ(gemm(plan::gpu_preset("h800-sxm")), 0.60);
  EXPECT_NEAR(gemm(plan::gpu_preset("gb200")), 0.5447, 1e-4);
  EXPECT_NEAR(gemm(plan::gpu_preset("b200")), 0.60 * 0.776 / 0.803, 1e-12);
  EXPECT_NEAR(gemm(plan::gpu_preset("gh200-144gb")), 0.60 * 0.838 / 0.803, 1e-12);
  EXPECT_DOUBLE_EQ(gemm(plan::gpu_preset("a100-80gb")), 0.75);
  EXPECT_NEAR(gemm(plan::gpu_preset("mi300x")), 0.60 * 0.514 / 0.803, 1e-12);
  EXPECT_DOUBLE_EQ(gemm(plan::gpu_preset("mi250x")), 0.60);  // no measurement in the table
  plan::GpuSpec capped = plan::gpu_preset("gb200");
  capped.bf16_tflops *= 0.9;
  EXPECT_DOUBLE_EQ(gemm(capped), gemm(plan::gpu_preset("gb200")));
  const double h100 = plan::fused_attention_efficiency(plan::gpu_preset("h100-sxm"), 4096, 128);
  EXPECT_NEAR(plan::fused_attention_efficiency(plan::gpu_preset("gb200"), 4096, 128) / h100,
              0.729 / 0.803, 1e-12);
}

// Activation offloading (GpuJob::offloaded_layers, Megatron-Core's cpu_offloading_num_layers):
// an offloaded layer's stash is in host memory at the peak, and the k copies (one stream, one
// after another) show only where they outlast the other n - 1 layers' forward, and backward.
// By hand: host links from the datasheets (a GB200's share of its superchip's 900 GB/s
// NVLink-C2C both ways, 225 GB/s each way; a GH200's 450; PCIe Gen5 x16 128 GB/s both ways on
// an H100, Gen4's 64 on an A100, Gen3's 32 on a V100); at pp 1 the activations fall by k
// stashes; GPT-2 124M's layer at 8 x 1024 tokens moves its stash over an A100's PCIe slower than
// it runs forward, so 11 of its 12 layers offloaded add 11 (copy - forward), and the backward's
// excess where there is one. Megatron-Core's rules: pp 1, no recomputation, fewer than n.
TEST(PlanTime, OffloadedActivationsCostOnlyWhatOutlastsALayer) {
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("gb200")), 225e9);
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("gb300")), 225e9);
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("gh200")), 450e9);
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("h100-sxm")), 64e9);
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("a100-80gb")), 32e9);
  EXPECT_DOUBLE_EQ(plan::host_link_bytes_per_s(plan::gpu_preset("v100-32gb")), 16e9);

  const ModelConfig m = model_preset("gpt2-124m");
  const plan::ClusterSpec cluster = a100_nodes(1);
  plan::TrainingJob job = job_of(1024, 64);
  const plan::PlanLayout l = plan::parse_layout("dp=8 mbs=8 zero=1");
  job.memory.micro_batches = 1;
  const double stash = plan::stashed_layer_bytes(m, l, job.memory);
  ASSERT_GT(stash, 0);
  auto activations = [&](int64_t k) {
    job.memory.offloaded_layers = k;
    return plan::predict_gpu_memory(m, l, job.memory).activations;
  };
  const double kept = activations(0);
  EXPECT_NEAR(kept - activations(1), stash, 1e-6 * kept);
  EXPECT_NEAR(kept - activations(11), 11 * stash, 1e-6 * kept);
  EXPECT_THROW(activations(12), Error);  // every layer: Megatron-Core refuses it
  job.memory.offloaded_layers = 2;
  EXPECT_THROW(plan::predict_gpu_memory(m, plan::parse_layout("dp=4 pp=2 mbs=8"), job.memory),
               Error);
  EXPECT_THROW(
      plan::predict_step_time(m, plan::parse_layout("dp=8 mbs=8 recompute=full"), cluster, job),
      Error);

  const plan::LayerCost c =
      plan::layer_cost(m, l, cluster, job, plan::default_gemm_efficiency(cluster.gpu));
  const double copy = stash / 32e9;
  ASSERT_GT(copy, c.forward_s);  // the case where the copies show
  job.memory.offloaded_layers = 0;
  const plan::StepTime none = plan::predict_step_time(m, l, cluster, job);
  job.memory.offloaded_layers = 11;
  const plan::StepTime eleven = plan::predict_step_time(m, l, cluster, job);
  const double expected =
      std::max(0.0, 11 * copy - 11 * c.forward_s) + std::max(0.0, 11 * copy - 11 * c.backward_s);
  EXPECT_NEAR(eleven.offload_s, expected, 1e-12);
  EXPECT_NEAR(eleven.total_s - none.total_s, expected, 1e-9);
  // Five copies hide behind eleven layers' passes unless one copy outlasts 2.2 of them.
  job.memory.offloaded_layers = 5;
  EXPECT_NEAR(
      plan::predict_step_time(m, l, cluster, job).offload_s,
      std::max(0.0, 5 * copy - 11 * c.forward_s) + std::max(0.0, 5 * copy - 11 * c.backward_s),
      1e-12);
  EXPECT_DOUBLE_EQ(none.offload_s, 0);
}

}  // namespace
}  // namespace loom::test
