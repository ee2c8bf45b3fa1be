// Published-run records beyond the shared file: whole tables of three sources (llm-foundry's
// MPT tables, torchtitan's H100 benchmark, Megatron-Bridge's dense rows), and how records are
// read: mixture-of-experts fields, the MLP form a parameter count settles, loose typing, edge
// values that must be refused rather than fatal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/plan/published_conventions.hpp"
#include "loom/plan/published_runs.hpp"
#include "loom/plan/time_model.hpp"
#include "published_runs_support.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

// model.moe is read into the experts, and MoE utilisation counts the parameters a token meets:
// Mixtral 8x7B (Jiang et al. 2024: 47B parameters, 13B active) by name, and by dimensions with
// the same experts; a malformed moe names the field, an incomplete one is refused; DeepSeek-V3
// is answered through its stand-in with the approximation printed.
TEST(PublishedRuns, MixtureOfExpertsRunsAreReadAndCountActiveParameters) {
  auto run = [](const std::string& id, const std::string& model) {
    const std::string text = R"([{"id": ")" + id + R"(", "kind": "throughput", "source": "a 2024 test",
      "model": )" + model + R"(, "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8},
      "parallelism": {"total_gpus": 64, "tp": 1, "pp": 1, "dp": 8, "ep": 8},
      "micro_batch": 1, "global_batch": 64, "recompute": "full", "measured": {"mfu": 0.3}}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  const plan::PublishedRun named = run("mixtral", R"({"name": "Mixtral 8x7B", "seq_len": 4096})");
  ASSERT_TRUE(named.refused.empty()) << named.refused;
  EXPECT_EQ(named.model.n_experts, 8);
  EXPECT_EQ(named.model.experts_per_token, 2);
  const plan::PublishedRun dims = run("dims", R"({"name": "an MoE", "layers": 32, "hidden": 4096, "heads": 32,
      "kv_heads": 8, "ffn": null, "vocab": 32000, "seq_len": 4096,
      "moe": {"routed_experts": 8, "shared_experts": 0, "top_k": 2, "expert_ffn": 14336}})");
  ASSERT_TRUE(dims.refused.empty()) << dims.refused;
  EXPECT_EQ(dims.model.parameter_count(), named.model.parameter_count());
  const double total = static_cast<double>(named.model.parameter_count());
  EXPECT_NEAR(total / 1e9, 46.7, 0.1);  // "47B"
  // 6 x active + 12 L h s, active = total - 32 layers x 6 idle experts x 3 x 4096 x 14336.
  const double active = total - 32.0 * 6 * 3 * 4096 * 14336;
  EXPECT_NEAR(active / 1e9, 12.9, 0.1);  // "13B active"
  EXPECT_NEAR(plan::flops_per_token(plan::FlopCount::PaLM, named.model, total, 4096, Recompute::None),
              6 * active + 12.0 * 32 * 4096 * 4096, 1e3);
  EXPECT_TRUE(plan::check_published_run(dims).answered);

  const plan::PublishedRun bad = run("bad", R"({"name": "x", "layers": 4, "hidden": 256, "heads": 4, "seq_len": 128,
      "moe": {"routed_experts": 4, "top_k": 6, "expert_ffn": 512}})");
  EXPECT_TRUE(bad.malformed);
  expect_contains(bad.refused, {"'bad': model.moe has routed_experts = 4 and top_k = 6"});
  const plan::PublishedRun vague = run("vague", R"({"name": "x", "layers": 4, "hidden": 256, "heads": 4, "seq_len": 128,
      "moe": {"routed_experts": 4}})");
  EXPECT_FALSE(vague.malformed);
  expect_contains(vague.refused, {"model.moe does not state routed_experts and top_k"});

  const plan::PublishedRun ds = run("ds", R"x({"name": "DeepSeek-V3 671B (37B active)", "layers": 61, "hidden": 7168,
      "heads": 128, "seq_len": 4096, "moe": {"routed_experts": 256, "shared_experts": 1, "top_k": 8, "expert_ffn": 2048}})x");
  ASSERT_TRUE(ds.refused.empty()) << ds.refused;
  EXPECT_EQ(ds.model.moe_first_dense, 3);
  std::string said;
  for (const std::string& a : ds.assumptions) said += a + "; ";
  expect_contains(said, {"multi-head latent attention approximated by 128 full heads of 56"});
  const plan::PublishedRun wrong = run("wrong", R"({"name": "DeepSeek-V3 671B", "layers": 30, "hidden": 7168, "heads": 128,
      "seq_len": 4096})");
  expect_contains(wrong.refused, {"reads as DeepSeek-V3 671B, but its layers or hidden size differ"});
  // Kimi K2 by name, through the same kind of stand-in: its config.json (61 layers of 7168, MLA
  // of 64 heads, the first layer dense of 18432, 384 experts of 2048 + 1 shared, vocabulary
  // 163,840 untied) counts 1026.4B parameters, 32.86B active with both embeddings; the
  // stand-in's attention is 1.6M a layer wider than MLA's 101.1M.
  const plan::PublishedRun kimi = run("kimi", R"({"name": "Kimi K2", "seq_len": 4096})");
  ASSERT_TRUE(kimi.refused.empty()) << kimi.refused;
  EXPECT_EQ(kimi.model.n_experts, 384);
  EXPECT_EQ(kimi.model.moe_first_dense, 1);
  const double kimi_total = static_cast<double>(kimi.model.parameter_count());
  EXPECT_NEAR(kimi_total / 1026.4e9, 1.0, 0.001);
  EXPECT_NEAR((kimi_total - 60.0 * 376 * 3 * 7168 * 2048) / 32.86e9, 1.0, 0.01);
  said.clear();
  for (const std::string& a : kimi.assumptions) said += a + "; ";
  expect_contains(said, {"approximated by 64 full heads of 56"});
  const plan::PublishedRun qwen = run("qwen", R"({"name": "Qwen2.5-72B", "seq_len": 8192})");
  ASSERT_TRUE(qwen.refused.empty()) << qwen.refused;
  EXPECT_EQ(qwen.model.n_layer, 80);
  EXPECT_EQ(qwen.model.ffn_hidden, 29568);
}

// Architectures whose heads are not hidden / heads wide, or whose layers attend through a
// sliding window, are answered from their published shapes:
// - gpt-oss-120b by name (its model card: 116.83B parameters, 5.13B active counting the output
//   matrix but not the token table; 18 of 36 layers under a 128-key window);
// - Qwen3 MoE by name and by the dimensions a table gives, its heads 128 wide from the preset
//   (the Qwen3 report: 30.5B total; 235B total, 22B active);
// - Gemma 2 9B (its report: 8,324,201,984 non-embedding parameters; loom leaves out the norms
//   after attention and MLP, 2 x 3584 a layer) and Nemotron-4 340B (96 heads of 192; its report:
//   331.6B non-embedding).
// Megatron-Bridge's model FLOPs per token, from its 26.08 table (TFLOP/s per GPU over tokens/s
// per GPU): gpt-oss-120b 1077e12 / 33024, Qwen3-30B-A3B 1029e12 / 44544, Qwen3-235B-A22B
// 1306e12 / 8816, all at 4096 tokens (its flop_utils counts a windowed layer's mean keys).
TEST(PublishedRuns, WideHeadsAndSlidingWindowsFromPublishedShapes) {
  auto run = [](const std::string& id, const std::string& model) {
    const std::string text = R"([{"id": ")" + id +
                             R"(", "kind": "throughput", "source": "a 2025 test",
      "model": )" + model + R"(, "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8},
      "parallelism": {"total_gpus": 64, "tp": 1, "pp": 1, "dp": 8, "ep": 8},
      "micro_batch": 1, "global_batch": 64, "recompute": "full", "measured": {"mfu": 0.3}}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  auto mb_flops = [](const ModelConfig& m) {
    return plan::flops_per_token(plan::FlopCount::NonEmbeddingCausal, m,
                                 static_cast<double>(m.parameter_count()), 4096, Recompute::None);
  };
  const plan::PublishedRun oss = run("oss", R"({"name": "GPT OSS 120B", "seq_len": 4096})");
  ASSERT_TRUE(oss.refused.empty()) << oss.refused;
  const ModelConfig& o = oss.model;
  EXPECT_EQ(o.q_dim(), 4096);
  EXPECT_EQ(o.windowed_layer_count(), 18);
  const double oss_total = static_cast<double>(o.parameter_count());
  EXPECT_NEAR(oss_total / 116.83e9, 1.0, 0.001);
  const double oss_active =
      oss_total - 36.0 * 124 * static_cast<double>(o.expert_parameter_count()) - 201088.0 * 2880;
  EXPECT_NEAR(oss_active / 5.13e9, 1.0, 0.01);
  EXPECT_NEAR(mb_flops(o) / (1077e12 / 33024), 1.0, 0.01);

  const plan::PublishedRun qwen = run("qwen", R"({"name": "Qwen3_30B_a3B", "seq_len": 4096})");
  ASSERT_TRUE(qwen.refused.empty()) << qwen.refused;
  EXPECT_EQ(qwen.model.head_dim(), 128);
  EXPECT_NEAR(static_cast<double>(qwen.model.parameter_count()) / 1e9, 30.5, 0.05);
  EXPECT_NEAR(mb_flops(qwen.model) / (1029e12 / 44544), 1.0, 0.01);
  const plan::PublishedRun dims =
      run("qwen_dims", R"({"name": "Qwen3-30B-A3B", "layers": 48, "hidden": 2048,
      "heads": 32, "kv_heads": 4, "ffn": null, "vocab": 151936, "seq_len": 4096,
      "moe": {"routed_experts": 128, "shared_experts": 0, "top_k": 8, "expert_ffn": 768}})");
  ASSERT_TRUE(dims.refused.empty()) << dims.refused;
  EXPECT_EQ(dims.model.head_dim(), 128);
  EXPECT_EQ(dims.model.parameter_count(), qwen.model.parameter_count());
  std::string said;
  for (const std::string& a : dims.assumptions) said += a + "; ";
  expect_contains(said, {"heads 128 wide (not hidden / heads = 64) from preset Qwen3 30B-A3B"});
  const plan::PublishedRun big = run("qwen_big", R"({"name": "Qwen3_235B_a22B", "seq_len": 4096})");
  ASSERT_TRUE(big.refused.empty()) << big.refused;
  const ModelConfig& b = big.model;
  const double big_total = static_cast<double>(b.parameter_count());
  EXPECT_NEAR(big_total / 1e9, 235, 0.5);
  EXPECT_NEAR((big_total - 94.0 * 120 * static_cast<double>(b.expert_parameter_count())) / 1e9, 22,
              0.5);
  EXPECT_NEAR(mb_flops(b) / (1306e12 / 8816), 1.0, 0.01);

  const plan::PublishedRun gemma = run("gemma", R"({"name": "gemma-2-9b", "seq_len": 8192})");
  ASSERT_TRUE(gemma.refused.empty()) << gemma.refused;
  EXPECT_EQ(gemma.model.q_dim(), 4096);
  EXPECT_EQ(gemma.model.windowed_layer_count(), 21);
  const double gemma_blocks = static_cast<double>(gemma.model.parameter_count()) - 256000.0 * 3584;
  EXPECT_NEAR(gemma_blocks + 2.0 * 3584 * 42, 8324201984.0, 1.0);
  const plan::PublishedRun nemotron =
      run("nemotron", R"({"name": "Nemotron-340B", "seq_len": 4096})");
  ASSERT_TRUE(nemotron.refused.empty()) << nemotron.refused;
  EXPECT_EQ(nemotron.model.head_dim(), 192);
  EXPECT_NEAR((static_cast<double>(nemotron.model.parameter_count()) - 2 * 256000.0 * 18432) / 1e9,
              331.6, 0.05);
  // NeMo 24.07's FP8 table counts attention over the full s x s (its TFLOP/s over its tokens/s):
  // Nemotron-8B 643e12 / 12507 and GPT3-20B 750e12 / 5851.
  auto nemo_flops = [](const ModelConfig& m, double seq) {
    return plan::flops_per_token(plan::FlopCount::NonEmbeddingFull, m,
                                 static_cast<double>(m.parameter_count()), seq, Recompute::None);
  };
  const plan::PublishedRun n8 = run("n8", R"({"name": "Nemotron-8B", "seq_len": 4096})");
  ASSERT_TRUE(n8.refused.empty()) << n8.refused;
  EXPECT_NEAR(nemo_flops(n8.model, 4096) / (643e12 / 12507), 1.0, 0.01);
  const plan::PublishedRun g20 = run("g20", R"({"name": "GPT3-20B", "seq_len": 2048})");
  ASSERT_TRUE(g20.refused.empty()) << g20.refused;
  EXPECT_NEAR(nemo_flops(g20.model, 2048) / (750e12 / 5851), 1.0, 0.01);
  // Llama 4 by variant (both are "17B"): Maverick 400B, and 17B active for both.
  const plan::PublishedRun scout = run("scout", R"({"name": "LLAMA4-Scout-LLM", "seq_len": 8192})");
  const plan::PublishedRun maverick =
      run("maverick", R"({"name": "Llama 4 Maverick 17B-128E", "seq_len": 8192})");
  ASSERT_TRUE(scout.refused.empty() && maverick.refused.empty())
      << scout.refused << maverick.refused;
  EXPECT_EQ(scout.model.n_experts, 16);
  EXPECT_EQ(maverick.model.moe_layer_count(), 24);
  EXPECT_NEAR(static_cast<double>(maverick.model.parameter_count()) / 400e9, 1.0, 0.005);
  for (const ModelConfig* m : {&scout.model, &maverick.model}) {
    const double idle = static_cast<double>(m->moe_layer_count()) *
                        static_cast<double>(m->n_experts - 1) *
                        static_cast<double>(m->expert_parameter_count());
    EXPECT_NEAR((static_cast<double>(m->parameter_count()) - idle) / 1e9, 17, 0.5);
  }
  // Hybrid Mamba-2 stacks by their names (test_plan_hybrid.cpp checks their presets).
  const plan::PublishedRun hybrid =
      run("hybrid", R"({"name": "Nemotron_3_Nano", "seq_len": 8192})");
  ASSERT_TRUE(hybrid.refused.empty()) << hybrid.refused;
  EXPECT_EQ(hybrid.model.hybrid_layer_count('M'), 23);
  const plan::PublishedRun v3 = run("v3", R"({"name": "Nemotron V3 Super 120B", "seq_len": 4096})");
  ASSERT_TRUE(v3.refused.empty()) << v3.refused;
  EXPECT_EQ(v3.model.moe_latent, 1024);
}

// A stated parameter count settles the MLP form the dimensions leave open, for a model no preset
// names: Nemotron-4 15B's dimensions (Parmar et al. 2024: 32 layers of 6144, 48 heads, 8 kv heads,
// a squared-ReLU MLP of 24576, 256,000-token vocabulary, untied) would be 20.5B as SwiGLU (+37%);
// as a 2-matrix MLP, by hand, 32 x (2 x 6144^2 + 2 x 6144 x 1024 + 2 x 6144 x 24576 + 2 x 6144) + 2
// x 256000 x 6144
// + 6144 = 15.63B (+4.2%), charged as a SwiGLU of 16384 (3 x 16384 = 2 x 24576).
TEST(PublishedRuns, StatedParameterCountSettlesTheMlpForm) {
  auto run = [](const std::string& id, const std::string& params) {
    const std::string text = R"([{"id": ")" + id +
                             R"(", "kind": "throughput", "source": "a 2024 test",
      "model": {"name": "an NVIDIA 15B", "layers": 32, "hidden": 6144, "heads": 48, "kv_heads": 8, "ffn": 24576,
                "vocab": 256000, "seq_len": 4096, "params_b": )" +
                             params + R"(},
      "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8}, "parallelism": {"total_gpus": 64, "tp": 8, "pp": 1, "dp": 8},
      "micro_batch": 1, "global_batch": 64, "recompute": "selective", "measured": {"mfu": 0.3}}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  const plan::PublishedRun nemotron = run("nemotron", "15");
  ASSERT_TRUE(nemotron.refused.empty()) << nemotron.refused;
  EXPECT_EQ(nemotron.model.ffn_hidden, 16384);
  EXPECT_FALSE(nemotron.model.tied_embeddings);
  const double by_hand = 32.0 * (2.0 * 6144 * 6144 + 2.0 * 6144 * 1024 + 2.0 * 6144 * 24576 + 2 * 6144) + 2.0 * 256000 * 6144 + 6144;
  EXPECT_EQ(static_cast<double>(nemotron.model.parameter_count()), by_hand);
  std::string said;
  for (const std::string& a : nemotron.assumptions) said += a + "; ";
  expect_contains(said, {"a 2-matrix MLP of 24576 (charged as a SwiGLU of 16384"});
  // Without a parameter count (or with one the guess meets) the guess stands.
  EXPECT_EQ(run("unstated", "null").model.ffn_hidden, 24576);
  EXPECT_EQ(run("swiglu", "20.5").model.ffn_hidden, 24576);
  // By name, its preset says as much.
  const std::string named = R"([{"id": "named", "kind": "throughput", "source": "a 2024 test",
      "model": {"name": "Nemotron-4 15B", "seq_len": 4096}, "hardware": {"gpu": "H100 80GB"},
      "parallelism": {"total_gpus": 8, "dp": 8}, "global_batch": 64, "measured": {"mfu": 0.3}}])";
  const plan::PublishedRun preset =
      plan::read_published_runs(write_file("named.json", named)).front();
  ASSERT_TRUE(preset.refused.empty()) << preset.refused;
  EXPECT_EQ(static_cast<double>(preset.model.parameter_count()), by_hand);
}

// Every row of llm-foundry's MPT benchmark tables (published/loom_mosaicml_tables.json, made
// by tools/published/mosaicml_tables.py): 201 runs from 512 to 65,536 tokens, heads of 64 and
// 128, A100 40/80 GB and H100 in BF16 and FP8, all answered, at the errors docs/PLANNER.md
// gives. Heads of 64 at long sequences (125M, 350M on A100s) were predicted 30-41% slow while
// attention ran at a GEMM's rate with the head width as k; fused attention holds them within 15%.
TEST(PublishedRuns, MosaicMlTablesAreAnsweredAtTheirPinnedErrors) {
  const std::vector<plan::PublishedRun> runs = loom_runs("loom_mosaicml_tables.json");
  ASSERT_EQ(runs.size(), 201u);
  const std::vector<plan::RunCheck> checks = check_all(runs);
  const plan::ValidationSummary s = plan::summarize(checks);
  EXPECT_EQ(s.answered, 201);
  EXPECT_EQ(median_and_p90(s), "5.2 14.8");
  for (const plan::RunCheck& c : checks) {
    const std::string& id = c.run->id;
    if (id.find("a100") == std::string::npos || (id.find("_125m_") == std::string::npos && id.find("_350m_") == std::string::npos))
      continue;
    const plan::FigureCheck* tokens = figure(c, plan::Figure::TokensPerSecond);
    ASSERT_NE(tokens, nullptr) << id;
    EXPECT_LT(std::fabs(tokens->relative_error), 0.15) << id;
  }
}

// Every row of torchtitan's December 2024 H100 benchmark (published/loom_torchtitan_tables.json,
// tools/published/torchtitan_tables.py): "Float8" is FP8; the 500 W power limit of these
// 700 W parts takes the peak to (500/700)^(1/3) = 0.894x; a pipeline's "local batch size" is
// split into pp micro-batches, and its interleaved schedule puts 2 stages on a rank, as
// torchtitan 9dec370 does by default. Throughput within 21% on every row. Under pipelining its
// FSDP keeps each stage's parameters gathered and their gradients unsharded in fp32 across the
// micro-batches (GpuJob::fsdp_gathered_under_pp): the six 405B pp 8 rows' reserved memory
// (72.7-84.9 GiB) within 18%, where they were 52-61% low without it.
TEST(PublishedRuns, TorchtitanTablesReadItsPipelineAndPowerDefaults) {
  const std::vector<plan::PublishedRun> runs = loom_runs("loom_torchtitan_tables.json");
  ASSERT_EQ(runs.size(), 18u);
  const std::vector<plan::RunCheck> checks = check_all(runs);
  for (const plan::RunCheck& c : checks) {
    const plan::PublishedRun& r = *c.run;
    ASSERT_TRUE(c.answered) << r.id << ": " << r.refused;
    EXPECT_NEAR(r.cluster.gpu.bf16_tflops, 989.5 * std::cbrt(500.0 / 700.0), 1e-9) << r.id;
    EXPECT_EQ(r.fp8, r.id.find("fp8") != std::string::npos || r.id.find("_t2_") != std::string::npos ||
                         r.id.find("_t4_") != std::string::npos || r.id.find("_t5_") != std::string::npos ||
                         r.id.find("_t6_") != std::string::npos)
        << r.id;
    const plan::FigureCheck* tokens = figure(c, plan::Figure::TokensPerSecond);
    ASSERT_NE(tokens, nullptr) << r.id;
    EXPECT_LT(std::fabs(tokens->relative_error), 0.22) << r.id;
    if (r.layout.pp > 1) {
      const plan::FigureCheck* memory = figure(c, plan::Figure::MemoryPerGpu);
      ASSERT_NE(memory, nullptr) << r.id;
      EXPECT_LT(std::fabs(memory->relative_error), 0.18) << r.id;
    }
  }
  const plan::RunCheck& one_f_one_b = checks[13 - 1];
  ASSERT_EQ(one_f_one_b.run->id, "torchtitan_h100_202412_t5_1f1b");
  EXPECT_EQ(one_f_one_b.layout.micro_batch, 4);  // local batch 32 over pp 8
  EXPECT_EQ(one_f_one_b.layout.vp, 1);
  const plan::RunCheck& interleaved = checks[14 - 1];
  EXPECT_EQ(interleaved.layout.micro_batch, 4);
  EXPECT_EQ(interleaved.layout.vp, 2);
  // Context parallelism as torchtitan runs it unless told: all-gather of the k|v repeated to the
  // query heads (Llama 3 8B: 4096 wide, not 1024). Forward wire bytes of cp 2 over its 65,536
  // tokens, 32,768 a rank, in bf16, by hand: 1 hop x 32768 x 2 x 4096 x 2 bytes.
  const plan::RunCheck& cp2 = checks[5 - 1];
  ASSERT_EQ(cp2.run->id, "torchtitan_h100_202412_t2_cp2");
  EXPECT_EQ(cp2.layout.cp_comm, CpComm::AllGather);
  EXPECT_DOUBLE_EQ(
      plan::context_parallel_wire_bytes(cp2.run->model, cp2.layout, 32768, 2, true).forward,
      32768.0 * 2 * 4096 * 2);
  EXPECT_DOUBLE_EQ(plan::context_parallel_wire_bytes(cp2.run->model, cp2.layout, 32768, 2).forward,
                   32768.0 * 2 * 1024 * 2);
  const plan::ValidationSummary s = plan::summarize(checks);
  // 8.3 before full recomputation reran tp's collectives; 5.8 before NVLink at NCCL's 370/450 of
  // its line rate (session 25: the 829 and 876 tokens/s rows of one layout, -3.8% to -7.9%), 6.4
  // before torchtitan's context-parallel all-gather of repeated k|v (cp 8: +5.0%, +8.4% to +3.8%,
  // -0.5%; cp 4 of the 405B -2.4% to -7.6%).
  EXPECT_EQ(median_and_p90(s), "5.7 15.2");
}

// NeMo 24.07's FP8 table and NeMo Automodel's BF16 pre-training table
// (published/loom_nemo_tables.json, transcribed from the NeMo and Automodel repositories): 19 of
// 22 answered, the three Nemotron 3 rows refused as Mamba hybrids. Automodel's gpt-oss rows leave
// ep out ("-"): the planner picks it (ep 16 for the 120B on 64 GPUs; read as 1 it was 63% slow).
// Every answered figure within 21% (the worst: DeepSeek-V3 on 256 GPUs -20.6%, an MLA stand-in);
// the table's median and p90 pinned. Nemotron-340B was -27.7%, then -20.1% with tp communication
// overlapped as NeMo's recipes set it and -21.4% with NVLink at NCCL's rate, while only full
// recomputation fit the planner's memory: its launcher config (NeMo-Framework-Launcher 24.07,
// nemotron_340b.yaml) states selective recomputation and apex's distributed Adam with bf16 state
// and gradients, now in the record: -0.1% (+3.2% since NeMo's attention runs at 1.4x, below).
TEST(PublishedRuns, NemoAndAutomodelTables) {
  const std::vector<plan::PublishedRun> runs = loom_runs("loom_nemo_tables.json");
  ASSERT_EQ(runs.size(), 22u);
  const std::vector<plan::RunCheck> checks = check_all(runs);
  int refused = 0;
  for (const plan::RunCheck& c : checks) {
    const plan::PublishedRun& r = *c.run;
    EXPECT_FALSE(r.malformed) << r.id;
    if (!c.answered) {
      ++refused;
      continue;
    }
    const plan::FigureCheck* tokens = figure(c, plan::Figure::TokensPerSecond);
    ASSERT_NE(tokens, nullptr) << r.id;
    // Automodel's Nemotron 3 rows (hybrid Mamba stacks, answered since session 30) miss by up to
    // 47%: open, docs/PLANNER.md "Hybrid Mamba stacks".
    if (!r.model.is_hybrid()) {
      EXPECT_LT(std::fabs(tokens->relative_error), 0.21) << r.id;
    }
    if (r.id == "nemo2407_h100_fp8_Nemotron-340B_128gpu") {
      EXPECT_EQ(c.layout.recompute, Recompute::Selective);
      EXPECT_LT(std::fabs(tokens->relative_error), 0.04);
    }
    if (r.id == "automodel_h100_bf16_gptoss120b_64gpu") {
      EXPECT_EQ(c.layout.ep, 16);
      EXPECT_LT(std::fabs(tokens->relative_error), 0.10);
    }
  }
  EXPECT_EQ(refused, 0);
  // Automodel's recipes (bf16 parameters with no fp32 copy, bf16 Adam moments for MoE, every
  // block checkpointed): every row of it fits its 80 GB, as it ran, at full recomputation. Before
  // session 32 (16 bytes a parameter) the planner fitted none of Qwen3 30B, Nemotron 3 Nano and
  // Ultra, or Kimi K2 and answered them at no recomputation.
  for (const plan::RunCheck& c : checks) {
    if (c.run->source_label != "NeMo Automodel") continue;
    EXPECT_TRUE(c.fits) << c.run->id;
    EXPECT_EQ(c.layout.recompute, Recompute::Full) << c.run->id;
    // Their notes name DeepEP: one row per destination rank (PlanMoe.OnePerDestinationRank...).
    EXPECT_EQ(c.run->moe_dispatch_per_rank, c.run->model.is_moe()) << c.run->id;
    EXPECT_EQ(c.run->master_bytes, 0) << c.run->id;
    EXPECT_EQ(c.run->moment_bytes, c.run->model.is_moe() ? 4 : 8) << c.run->id;
  }
  const plan::ValidationSummary s = plan::summarize(checks);
  // 5.8 before Kimi K2's preset (session 21), 4.4 and 19.5 before Nemotron-340B's stated
  // optimizer and recomputation (session 25), 3.7 and 11.2 before NeMo's attention at 1.4x the
  // 2023-24 rate (session 29), 4.2 and 11.3 over 19 rows before the 3 Nemotron 3 rows were
  // answered (session 30), 4.3 and 11.5 before Automodel's recipes (session 32: their rows fit
  // at full recomputation, 4 of them had been answered unfitted at none, 2.7-11.5% off; at full
  // Qwen3 30B -12.9%, Nemotron 3 Nano -17.5%, DeepSeek-V3 on 256 GPUs -18.2%), 4.5 and 17.5
  // before uneven pipeline stages were balanced against the head (session 39, stage_split).
  EXPECT_EQ(median_and_p90(s), "4.3 17.5");
}

// NeMo 24.03.01's "Long Input Sequences" table (published/loom_nemo_long_sequence.json): Llama 2
// 7B in FP8 at 4K to 1M tokens on 4 to 1,024 H100s, cp up to 32. Attention's share of the FLOPs
// grows from 13% to 97%, so the rows measure the rate of NeMo's fused attention (cuDNN's, under
// Transformer Engine 1.x): at FlashAttention-2's rate they came out 10% (4K) to 34% (1M) slow,
// at 1.4x it within 8.2% at every length (fitted there and on the 24.07 table: in sample).
TEST(PublishedRuns, NemoLongSequenceTable) {
  const std::vector<plan::PublishedRun> runs = loom_runs("loom_nemo_long_sequence.json");
  ASSERT_EQ(runs.size(), 9u);
  const std::vector<plan::RunCheck> checks = check_all(runs);
  for (const plan::RunCheck& c : checks) {
    SCOPED_TRACE(c.run->id);
    ASSERT_TRUE(c.answered) << c.run->refused;
    const plan::FigureCheck* tokens = figure(c, plan::Figure::TokensPerSecond);
    ASSERT_NE(tokens, nullptr);
    EXPECT_LT(std::fabs(tokens->relative_error), 0.09);
    EXPECT_EQ(c.layout.cp, c.run->layout.cp);
  }
  EXPECT_EQ(checks.back().run->seq_len, 1048576);
  EXPECT_EQ(checks.back().layout.cp, 32);
}

// 150 trials of Hagemann et al.'s sweeps the planner had not seen when its rules were set
// (published/loom_hagemann_trials.json, tools/published/hagemann_trials.py): 71 measured, 79
// out of memory. Every one answered; 140 of 150 verdicts right: 7 trials that ran out of
// memory predicted to fit, and 3 that ran predicted just over 80 GiB (123 before the
// unfused RMSNorm of the trials whose kernel names none, 130 before the sheets' 128,000-token
// vocabulary). MFU median and p90 pinned: 11.3% and 34.2% before the RMSNorm, 9.2% and 24.3%
// before the vocabulary, whose MFU convention had hidden the 256-GPU sheet's slowness (docs/
// PLANNER.md: the same layout measured twice differs by up to 15%, the 128- and 256-GPU sheets
// run 15-40% below the 64-GPU ones). Step time's median |error| went from 12.1% to 7.9% with it.
TEST(PublishedRuns, HagemannSweepsTrialsItHadNotSeen) {
  const std::vector<plan::PublishedRun> runs = loom_runs("loom_hagemann_trials.json");
  ASSERT_EQ(runs.size(), 150u);
  const std::vector<plan::RunCheck> checks = check_all(runs);
  int oom_predicted_to_fit = 0, ran_predicted_oom = 0;
  std::vector<double> step_errors;
  for (const plan::RunCheck& c : checks) {
    ASSERT_TRUE(c.answered) << c.run->id << ": " << c.run->refused;
    const plan::FigureCheck* verdict = figure(c, plan::Figure::Fits);
    ASSERT_NE(verdict, nullptr) << c.run->id;
    if (verdict->predicted != verdict->measured.value) {
      if (verdict->measured.value == 0) {
        ++oom_predicted_to_fit;
      } else {
        ++ran_predicted_oom;
        // At the edge: the predicted peak within 6% of the 80 GiB (79.8, 81.2 and 84.3 GiB, all
        // tp 1 with the whole model's bf16 parameters and gradients).
        EXPECT_LT(c.reserved_gib, 80 * 1.06) << c.run->id;
      }
    }
    if (const plan::FigureCheck* step = figure(c, plan::Figure::StepTime))
      step_errors.push_back(std::fabs(step->relative_error));
  }
  // 16 before the gathered logits (8 bytes over the whole V), 15 before those were counted
  // at 14 bytes (the loss's fp32 log-softmax and gradients, session 24).
  EXPECT_EQ(oom_predicted_to_fit, 7);
  EXPECT_EQ(ran_predicted_oom, 3);
  const plan::ValidationSummary s = plan::summarize(checks);
  EXPECT_EQ(s.verdicts, 150);
  EXPECT_EQ(s.verdicts_right, 140);
  EXPECT_EQ(s.rates.count, 71);
  // 8.7 and 30.4 before PyTorch's attention was counted op by op (8.7, 28.0), the framework's
  // fp32 all-reduce and parameter all-gather after the backward were charged (8.1, 24.5) and
  // its gated MLP's third tensor-parallel all-reduce backward (7.3, 23.4), and full
  // recomputation's rerun of the forward's collectives (7.2, 21.3), NVLink at NCCL's 370/450 of
  // its line rate (7.3, 19.8; session 25: tp 8 trials +20% on average before), and the head's
  // logits gathered over tp with the loss over the whole vocabulary on every rank (tp 8 +10%),
  // and uneven pipeline stages balanced against the head (5.9, 16.8; session 39).
  EXPECT_EQ(median_and_p90(s), "5.8 16.6");
  ASSERT_EQ(step_errors.size(), 71u);
  std::sort(step_errors.begin(), step_errors.end());
  // The median: 12.1%, 7.9%, 7.6%, 7.1%, then 6.1% before.
  EXPECT_NEAR(step_errors[35], 0.0565, 0.0005);
}

// What records write loosely is read by its meaning: numbers as strings, a utilisation in
// percent, checkpointing as true/false or "True"; a string that is not a number still names
// the field (BadFilesNameTheRunAndTheField).
TEST(PublishedRuns, LooselyTypedFieldsAreReadByTheirMeaning) {
  auto run = [](const std::string& id, const std::string& tp, const std::string& recompute, const std::string& mfu) {
    const std::string text = R"([{"id": ")" + id + R"(", "kind": "throughput",
      "model": {"layers": 8, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128},
      "hardware": {"gpu": "A100 80GB", "gpus_per_node": 8},
      "parallelism": {"total_gpus": 8, "tp": )" + tp + R"(, "pp": 1, "dp": 4, "sequence_parallel": "yes"},
      "micro_batch": 1, "global_batch": 64, "recompute": )" + recompute + R"(, "measured": {"mfu": )" + mfu + R"(}}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  const plan::PublishedRun loose = run("loose", "\"2\"", "true", "42.5");
  ASSERT_TRUE(loose.refused.empty()) << loose.refused;
  EXPECT_EQ(loose.layout.tp, 2);
  EXPECT_TRUE(loose.layout.sequence_parallel);
  EXPECT_EQ(loose.layout.recompute, Recompute::Full);
  ASSERT_EQ(loose.measured.size(), 1u);
  EXPECT_DOUBLE_EQ(loose.measured.front().value, 0.425);
  EXPECT_EQ(run("t", "2", "\"True\"", "0.4").layout.recompute, Recompute::Full);
  EXPECT_EQ(run("f", "2", "false", "0.4").layout.recompute, Recompute::None);
  EXPECT_EQ(run("ac", "2", "\"activation checkpointing every layer\"", "0.4").layout.recompute, Recompute::Full);
  EXPECT_TRUE(run("bad", "\"two\"", "true", "0.4").malformed);
}

// Cells as tables print them: an empty one ("n/a", "-", "") is not stated, numbers keep their
// thousands separators and units ("5,984", "80 GiB" in a field of GB, "42%" for a utilisation),
// a parenthesised note after a number is a note ("2 (SP)"), an FSDP column's 0 / 1 is off / on,
// and flags read "no" / "off" / "enabled". A unit a field cannot have is still malformed.
TEST(PublishedRuns, TableCellsAreReadAsTablesPrintThem) {
  auto run = [](const std::string& id, const std::string& parallelism, const std::string& rest) {
    const std::string text = R"([{"id": ")" + id +
                             R"(", "kind": "throughput", "source": "NVIDIA-NeMo/Megatron-Bridge",
      "model": {"name": "x", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 1000, "seq_len": 1024},
      "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8, "gpu_mem_gb": "80 GiB"},
      "parallelism": {"total_gpus": 16, "pp": 1, "dp": 8)" +
                             parallelism + R"(}, )" + rest + R"(}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  const std::string ok =
      R"("micro_batch": 1, "global_batch": "1,280", "measured": {"tokens_per_s_per_gpu": "5,984"})";
  const plan::PublishedRun cells = run(
      "cells",
      R"x(, "tp": "2 (SP)", "vp": "n/a", "cp": "-", "ep": "", "zero_stage": "N/A", "fsdp": 1, "sequence_parallel": "no")x",
      ok);
  ASSERT_TRUE(cells.refused.empty()) << cells.refused;
  EXPECT_EQ(cells.layout.tp, 2);
  EXPECT_EQ(cells.layout.vp, 1);
  EXPECT_EQ(cells.layout.cp, 1);
  EXPECT_EQ(cells.layout.zero_stage, 3);  // FSDP column 1
  EXPECT_FALSE(cells.layout.sequence_parallel);
  EXPECT_EQ(cells.global_batch, 1280);
  EXPECT_DOUBLE_EQ(cells.cluster.gpu.hbm_bytes, 80.0 * 1024 * 1024 * 1024);  // as "gpu_mem_gb": 80
  ASSERT_EQ(cells.measured.size(), 1u);
  EXPECT_DOUBLE_EQ(cells.measured.front().value, 5984);
  EXPECT_EQ(run("ddp", R"(, "tp": 1, "fsdp": 0)", ok).layout.zero_stage,
            1);  // Megatron's optimizer
  EXPECT_EQ(run("fsdp_on", R"(, "tp": 1, "fsdp": "enabled")", ok).layout.zero_stage, 3);
  // "n/a" or a dash for a parallel degree is that parallelism not used; separators repeat.
  const plan::PublishedRun unused =
      run("unused", R"(, "tp": "n/a", "ep": "-")",
          R"("micro_batch": 1, "global_batch": "1,234,567", "measured": {"mfu": 0.4})");
  EXPECT_EQ(unused.layout.tp, 1);
  EXPECT_FALSE(unused.unstated.tp);
  EXPECT_EQ(unused.global_batch, 1234567);
  const plan::PublishedRun percent =
      run("pct", R"(, "tp": 1, "sequence_parallel": "enabled")",
          R"("micro_batch": 1, "global_batch": 64, "measured": {"mfu": "42%"})");
  ASSERT_EQ(percent.measured.size(), 1u);
  EXPECT_DOUBLE_EQ(percent.measured.front().value, 0.42);
  EXPECT_TRUE(run("tb", R"(, "tp": "2 TB")", ok).malformed);
  EXPECT_TRUE(run("pct_tp", R"(, "tp": "2%")", ok).malformed);
  EXPECT_TRUE(run("range", R"(, "tp": "2-4")", ok).malformed);
}

// Records at the edges: each is answered, refused with a reason or malformed naming its field,
// and none stops the others (tests/fuzz/fuzz_published_runs runs the same under ASan/UBSan).
TEST(PublishedRuns, EdgeRecordsAreRefusedOrAnsweredNeverFatal) {
  auto run = [](const std::string& id, const std::string& parallelism, const std::string& rest) {
    const std::string text = R"([{"id": ")" + id + R"(", "kind": "throughput", "source": "Doe 2024",
      "model": {"name": "x", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 1000, "seq_len": 1024},
      "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8},
      "parallelism": {"total_gpus": 8, "tp": 1, "pp": 1, "dp": 8)" + parallelism + R"(}, )" + rest + R"(}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  const std::string ok = R"("micro_batch": 1, "global_batch": 64, "recompute": "none", "measured": {"mfu": 0.4})";
  const plan::PublishedRun zero_mbs = run("mbs0", "", R"("micro_batch": 0, "global_batch": 64, "recompute": "none", "measured": {"mfu": 0.4})");
  EXPECT_TRUE(zero_mbs.unstated.micro_batch);
  EXPECT_TRUE(plan::check_published_run(zero_mbs).answered);
  expect_contains(run("cp", R"(, "cp": 3, "total_gpus": 24)", ok).refused, {"cp = 3 does not divide seq_len 1024"});
  EXPECT_EQ(run("zero", R"(, "zero_stage": "ZeRO-1")", ok).layout.zero_stage, 1);
  EXPECT_TRUE(run("zero_bad", R"(, "zero_stage": "sharded")", ok).malformed);
  // GPUs as sources print them: the H100's PCIe and NVL parts are not its SXM part ("NVLink" is
  // not "NVL"), an A800 is an A100 with NVLink cut to 400 GB/s.
  EXPECT_EQ(gpu_of("pcie", "NVIDIA H100 PCIe 80GB"), "h100-pcie");
  EXPECT_EQ(gpu_of("nvl", "H100 NVL 94GB"), "h100-nvl");
  EXPECT_EQ(gpu_of("sxm", "H100 SXM5 80GB (NVLink 4)"), "h100-sxm");
  EXPECT_EQ(gpu_of("a800", "A800-SXM4-80GB"), "a800-80gb");
  // What the fuzzer found: total_gpus 0 gave dp 0 and a division by zero.
  expect_contains(run("no_gpus", R"(, "cp": 2, "dp": 4, "total_gpus": 0)", ok).refused, {"parallelism.total_gpus = 0"});
  const plan::PublishedRun huge = run("huge", R"(, "tp": 100000000)", ok);
  EXPECT_TRUE(huge.malformed);
  expect_contains(huge.refused, {"parallelism.tp = 1e+08 is out of range"});
  expect_contains(run("neg", "", R"("micro_batch": 1, "global_batch": 64, "measured": {"mfu": -0.4})").refused,
                  {"'neg': a measured MFU of -0.4 is not a positive number"});
  // A billion sequences through two pipeline stages: the closed form stands in for the
  // simulation (no action lists of 10^9 chunks), and the bubble is nil.
  const plan::PublishedRun many = run("many", R"(, "pp": 2, "dp": 1, "total_gpus": 2)",
                                      R"("micro_batch": 1, "global_batch": 1000000000, "recompute": "none", "measured": {"mfu": 0.4})");
  const plan::RunCheck c = plan::check_published_run(many);
  EXPECT_TRUE(c.answered);
  EXPECT_GT(c.step_s, 0);
}

}  // namespace
}  // namespace loom::test
