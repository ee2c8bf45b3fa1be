// The published architectures of 2019-24's GPU-trained models (plan/published_models_more.cpp),
// found by the names records give them and checked against the parameter counts their papers
// and model cards state; names of other models and of other families stay theirs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "loom/plan/published_models.hpp"
#include "loom/plan/published_runs.hpp"
#include "published_runs_support.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

struct Stated {
  const char* printed;  // as a record names it
  const char* preset;   // the preset it must find
  double params;        // the parameter count its source states
  double tolerance;     // relative: what loom's layers count that the model lacks, or rounding
  const char* source;
};

// loom's GPT layer counts learned position embeddings (seq x h): BLOOM (ALiBi), GPT-NeoX,
// Pythia and GPT-J (rotary) have none, 0.02-0.12% of these models; a count stated as "175B" is
// rounded to its last digit (Turing-NLG's "17 billion": 3%; its vocabulary is assumed).
const Stated kStated[] = {
    {"BLOOM-176B", "BLOOM 176B", 176247271424, 0.0003, "BigScience 2022, sec. 3.2 / model card"},
    {"bigscience/bloom-7b1", "BLOOM 7B1", 7069016064, 0.0015, "bloom-7b1 model card"},
    {"GPT-NeoX-20B", "GPT-NeoX 20B", 20554567680, 0.001, "Black et al. 2022, Table 1"},
    {"Pythia 12B", "Pythia 12B", 11846072320, 0.001, "Biderman et al. 2023, Table 1"},
    {"EleutherAI/pythia-6.9b", "Pythia 6.9B", 6857302016, 0.0015, "Biderman et al. 2023, Table 1"},
    {"pythia-70m", "Pythia 70M", 70426624, 0.02, "Biderman et al. 2023, Table 1"},
    {"GPT-J-6B", "GPT-J 6B", 6053381344, 0.0015, "EleutherAI/gpt-j-6b model card"},
    {"OPT-175B", "OPT 175B", 175e9, 0.003, "Zhang et al. 2022, Table 1"},
    {"facebook/opt-66b", "OPT 66B", 66e9, 0.005, "Zhang et al. 2022, Table 1"},
    {"OPT 125M", "OPT 125M", 125e6, 0.01, "Zhang et al. 2022, Table 1"},
    {"MT-NLG 530B", "MT-NLG 530B", 530e9, 0.001, "Smith et al. 2022"},
    {"Megatron-Turing NLG", "MT-NLG 530B", 530e9, 0.001, "Smith et al. 2022"},
    {"Megatron-LM 8.3B", "Megatron-LM 8.3B", 8.3e9, 0.003, "Shoeybi et al. 2019, Table 2"},
    {"Turing-NLG 17B", "Turing-NLG 17B", 17e9, 0.03, "Microsoft 2020"},
    {"BloombergGPT", "BloombergGPT 50B", 50.6e9, 0.001, "Wu et al. 2023, sec. 2.3"},
    {"DeepSeek LLM 67B", "DeepSeek LLM 67B", 67e9, 0.007, "DeepSeek-AI 2024, Table 2"},
    {"DBRX", "DBRX 132B", 132e9, 0.004, "Databricks 2024"},
    {"Grok-1", "Grok-1 314B", 314e9, 0.006, "xai-org/grok-1 README"},
    {"DeepSeekMoE 16B", "DeepSeekMoE 16B", 16.4e9, 0.003, "Dai et al. 2024"},
    // Multi-head latent attention stood in for by full heads of the same parameters (2%).
    {"DeepSeek-V2", "DeepSeek-V2 236B", 236e9, 0.005, "DeepSeek-AI 2024, sec. 3.1"},
    {"deepseek-ai/DeepSeek-V2-Lite", "DeepSeek-V2-Lite 16B", 15.7e9, 0.005,
     "DeepSeek-AI 2024, Appendix B"},
    {"GLM-130B", "GLM-130B", 130e9, 0.005, "Zeng et al. 2022"},
    {"Code Llama 34B", "Code Llama 34B", 33.7e9, 0.002, "Roziere et al. 2023"},
    {"Llama 2 34B", "Llama 2 34B", 33.7e9, 0.002, "Touvron et al. 2023 (Code Llama 34B's layers)"},
    {"Yi-34B", "Yi 34B", 34.4e9, 0.002, "01.AI 2024"},
    {"MPT-30B", "MPT 30B", 29.95e9, 0.003, "mosaicml/mpt-30b model card"},
    {"Falcon-180B", "Falcon 180B", 180e9, 0.01, "Almazrouei et al. 2023"},
    {"StarCoder 15.5B", "StarCoder 15.5B", 15.5e9, 0.01, "Li et al. 2023"},
};

TEST(PublishedPresets, NamedModelsOfTheirPapersWithTheirParameterCounts) {
  for (const Stated& s : kStated) {
    SCOPED_TRACE(s.printed);
    const std::optional<plan::PublishedModel> m = plan::find_published_model(s.printed);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->name, s.preset);
    EXPECT_NO_THROW(m->config.validate());
    EXPECT_NEAR(static_cast<double>(m->config.parameter_count()) / s.params, 1.0, s.tolerance)
        << s.source;
  }
}

// Mixtures of experts count what a token meets: DBRX 36B of 132B (16 experts of 10752, top 4, on
// 40 layers of 6144), DeepSeekMoE 16B 2.8B (its paper; 64 experts of 1408, top 6, on 27 of 28
// layers of 2048; both embeddings of 102,400 x 2048 counted).
TEST(PublishedPresets, MixturesOfExpertsCountTheirActiveParameters) {
  const plan::PublishedModel dbrx = *plan::find_published_model("DBRX Base");
  const double dbrx_active =
      static_cast<double>(dbrx.config.parameter_count()) - 40.0 * (16 - 4) * 3 * 6144 * 10752;
  EXPECT_NEAR(dbrx_active / 36e9, 1.0, 0.02);
  const plan::PublishedModel ds = *plan::find_published_model("deepseek-moe-16b-base");
  EXPECT_EQ(ds.config.moe_first_dense, 1);
  EXPECT_EQ(ds.config.n_shared_experts, 2);
  const double ds_active =
      static_cast<double>(ds.config.parameter_count()) - 27.0 * (64 - 6) * 3 * 2048 * 1408;
  EXPECT_NEAR(ds_active / 2.8e9, 1.0, 0.02);
  // DeepSeek-V2: 160 experts of 1536, top 6, on 59 of 60 layers of 5120: 21B of 236B active.
  const plan::PublishedModel v2 = *plan::find_published_model("DeepSeek-V2.5");
  EXPECT_EQ(v2.name, "DeepSeek-V2 236B");
  const double v2_active =
      static_cast<double>(v2.config.parameter_count()) - 59.0 * (160 - 6) * 3 * 5120 * 1536;
  EXPECT_NEAR(v2_active / 21e9, 1.0, 0.03);
}

// Apertus (Swiss AI 2025): xIELU's two matrices of F stand as a SwiGLU of 2F/3, so the layer
// keeps its parameters. By hand from its launch scripts' dimensions: per layer q and o (2 h^2), k
// and v (2 h 1024), the MLP (2 h F) and two norms (2 h); both embeddings (V = 131,072) and the
// final norm.
TEST(PublishedPresets, ApertusKeepsItsTwoMatrixMlpsParameters) {
  auto by_hand = [](double layers, double h, double f) {
    return layers * (2 * h * h + 2 * h * 1024 + 2 * h * f + 2 * h) + 2 * 131072 * h + h;
  };
  const plan::PublishedModel big = *plan::find_published_model("swiss-ai/Apertus-70B-2509");
  EXPECT_EQ(big.name, "Apertus 70B");
  EXPECT_DOUBLE_EQ(static_cast<double>(big.config.parameter_count()), by_hand(80, 8192, 43008));
  EXPECT_EQ(big.batch_tokens, 4096 * 4096);
  const plan::PublishedModel small = *plan::find_published_model("Apertus 8B");
  EXPECT_DOUBLE_EQ(static_cast<double>(small.config.parameter_count()), by_hand(32, 4096, 21504));
  EXPECT_FALSE(small.approximation.empty());
}

// Names that are not these models: other families' and words that contain a family's letters.
TEST(PublishedPresets, OtherNamesKeepTheirFamilies) {
  EXPECT_EQ(plan::find_published_model("GPT-3 175B (Megatron-LM)")->name, "GPT-3 175B");
  EXPECT_EQ(plan::find_published_model("Llama 2 70B")->name, "Llama 2 70B");
  EXPECT_EQ(plan::find_published_model("CodeLlama-70b")->name, "Code Llama 70B");
  EXPECT_EQ(plan::find_published_model("DeepSeek-V3 671B")->name, "DeepSeek-V3 671B");
  // Megatron-Bridge's tables name it without a size; V3 has one.
  EXPECT_EQ(plan::find_published_model("DeepSeekV3 (w/o MTP)")->name, "DeepSeek-V3 671B");
  EXPECT_FALSE(plan::find_published_model("DeepSeekV4 Flash").has_value());
  // A size decides where one is given; another model's architecture string is not V3.
  EXPECT_FALSE(plan::find_published_model("DeepSeek-V3 236B").has_value());
  EXPECT_NE(plan::find_published_model("Kimi K2 (DeepseekV3ForCausalLM)")->name,
            "DeepSeek-V3 671B");
  EXPECT_EQ(plan::find_published_model("bloom-560m")->name, "BLOOM 560M");
  EXPECT_EQ(plan::find_published_model("StarCoder2-15B")->name, "StarCoder2 15B");
  EXPECT_EQ(plan::find_published_model("GPT-2 XL")->name, "GPT-2 1.5B");
  EXPECT_EQ(plan::find_published_model("OLMo-2-1124-13B")->name, "OLMo 2 13B");
  EXPECT_EQ(plan::find_published_model("Kimi-Dev-72B (Qwen2.5)")->name, "Qwen2.5 72B");
  EXPECT_EQ(plan::find_published_model("Kimi K2")->name, "Kimi K2 1T");
  EXPECT_FALSE(plan::find_published_model("DeepSeek Coder 33B").has_value());
  EXPECT_FALSE(plan::find_published_model("an adopted 13B model").has_value());
  EXPECT_EQ(plan::find_published_model("OPT 7B")->name, "OPT 6.7B");  // within half a billion
  EXPECT_FALSE(plan::find_published_model("OPT 20B").has_value());    // no such size
  // Other architectures under the same names: StarCoderBase's small sizes, Falcon 2 and its
  // Mamba, OLMoE, Megatron-BERT; and Megatron-LM's GPT-2 named after GPT-2.
  EXPECT_FALSE(plan::find_published_model("bigcode/starcoderbase-1b").has_value());
  EXPECT_EQ(plan::find_published_model("bigcode/starcoder")->name, "StarCoder 15.5B");
  EXPECT_FALSE(plan::find_published_model("Falcon2-11B").has_value());
  EXPECT_FALSE(plan::find_published_model("Falcon-Mamba-7B").has_value());
  EXPECT_EQ(plan::find_published_model("tiiuae/falcon-40b")->name, "Falcon 40B");
  EXPECT_FALSE(plan::find_published_model("OLMoE-1B-7B").has_value());
  EXPECT_FALSE(plan::find_published_model("Megatron-BERT 3.9B").has_value());
  EXPECT_EQ(plan::find_published_model("Megatron-LM GPT-2 8.3B")->name, "Megatron-LM 8.3B");
}

// A record naming OPT-175B as its paper ran it (992 A100s: tp 8 over 124 fully sharded
// replicas, "2M tokens" a batch) is answered: 1024 sequences do not split over 124 replicas, so
// the nearest batch that does is run, and said.
TEST(PublishedPresets, AStatedBatchNoReplicaCountSplitsIsRunAsTheNearestThatDoes) {
  const std::string text =
      R"([{"id": "opt", "kind": "throughput", "source": "Zhang et al. 2022, OPT",
    "model": {"name": "OPT-175B", "layers": null, "seq_len": 2048},
    "hardware": {"gpu": "A100 80GB", "gpus_per_node": 8},
    "parallelism": {"total_gpus": 992, "tp": 8, "pp": 1, "dp": 124, "zero_stage": 3},
    "global_batch": 1024, "recompute": "full", "precision": "FP16",
    "measured": {"tflops_per_gpu": 147}}])";
  const plan::PublishedRun r = plan::read_published_runs(write_file("opt.json", text)).front();
  ASSERT_TRUE(r.refused.empty()) << r.refused;
  const plan::RunCheck c = plan::check_published_run(r);
  ASSERT_TRUE(c.answered);
  std::string notes;
  for (const std::string& n : c.notes) notes += n + "; ";
  expect_contains(notes,
                  {"global batch 1024 is not a multiple of dp 124 x micro-batch 1: run as 992"});
  // The tokens a step are the 992 sequences the time was predicted for.
  EXPECT_NEAR(c.tokens_per_s_per_gpu * 992 * c.step_s / (992.0 * 2048), 1.0, 1e-12);

  // A step time is predicted for the stated 1024 sequences: the 992's scaled by 1024 / 992.
  std::string timed = text;
  timed.replace(timed.find(R"("tflops_per_gpu": 147)"), 21, R"("step_time_s": 30)");
  const plan::RunCheck t = plan::check_published_run(
      plan::read_published_runs(write_file("opt_step.json", timed)).front());
  const plan::FigureCheck* step = figure(t, plan::Figure::StepTime);
  ASSERT_NE(step, nullptr);
  EXPECT_NEAR(step->predicted / (t.step_s * 1024.0 / 992.0), 1.0, 1e-12);

  // 100 sequences on 124 replicas would become 124, 24% more: a different run, refused.
  std::string small = text;
  small.replace(small.find(R"("global_batch": 1024)"), 20, R"("global_batch": 100)");
  const plan::RunCheck refused = plan::check_published_run(
      plan::read_published_runs(write_file("opt_small.json", small)).front());
  EXPECT_FALSE(refused.answered);
  ASSERT_FALSE(refused.picks.empty());
  expect_contains(refused.picks.front(),
                  {"no micro-batch size splits global batch 100 over dp = 124"});
}

}  // namespace
}  // namespace loom::test
