// Multi-token prediction and uneven pipeline stages: where a model's MTP depths train (the
// source's stack), where their weights sit (the last stage), and how uneven stages are split
// against the last stage's head and depths (balanced_stage_layers), worked by hand.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "loom/plan/memory_model.hpp"
#include "loom/plan/published_models.hpp"
#include "loom/plan/published_runs.hpp"
#include "loom/plan/rank_parameters.hpp"
#include "published_runs_support.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

// Multi-token prediction is Megatron-Core's: DeepSeek-V3 trains with one depth (its report, sec.
// 2.2 and 4.2) where its Megatron-Bridge recipe sets mtp_num_layers 1, the depth and the loss on
// the last pipeline stage; a "w/o MTP" row and NeMo Automodel (a Hugging Face-based stack, whose
// rows count 249.7 GFLOP a token against Megatron-Bridge's 260) train without it. An uneven
// split is balanced against the last stage's head and depth: on 16 stages Megatron-Bridge's
// layout ("Et*4|(t*4|)*14tmL", recipes/deepseek/deepseek_v3.py) gives 15 stages 4 layers and the
// last one layer, the depth and the loss.
TEST(PublishedRuns, MultiTokenPredictionIsMegatronCoresAndSitsOnTheLastStage) {
  auto run = [](const std::string& id, const std::string& name, const std::string& source) {
    const std::string text = R"([{"id": ")" + id + R"(", "kind": "throughput", "source": ")" +
                             source + R"(",
      "model": {"name": ")" + name +
                             R"(", "seq_len": 4096},
      "hardware": {"gpu": "B200", "gpus_per_node": 8},
      "parallelism": {"total_gpus": 256, "tp": 1, "pp": 16, "cp": 1, "dp": 16, "ep": 8, "zero_stage": 1},
      "micro_batch": 1, "global_batch": 4096, "recompute": "none", "precision": "FP8-MX",
      "measured": {"tokens_per_s_per_gpu": 2815}}])";
    return plan::read_published_runs(write_file(id + ".json", text)).front();
  };
  auto said = [](const plan::PublishedRun& r) {
    std::string out;
    for (const std::string& a : r.assumptions) out += a + "; ";
    return out;
  };
  const std::string bridge = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md";
  const plan::PublishedRun with = run("mtp", "DeepSeekV3", bridge);
  ASSERT_TRUE(with.refused.empty()) << with.refused;
  EXPECT_EQ(with.model.mtp_layers, 1);
  expect_contains(said(with), {"1 MTP depth on the last pipeline stage"});
  const plan::RunCheck checked = plan::check_published_run(with);
  ASSERT_TRUE(checked.answered);
  std::string picks;
  for (const std::string& p : checked.picks) picks += p + "; ";
  expect_contains(picks, {"balanced against the last one's head and MTP", "15 of 4, the last 1"});

  const plan::PublishedRun without = run("no_mtp", "DeepSeekV3 (w/o MTP)", bridge);
  EXPECT_EQ(without.model.mtp_layers, 0);
  expect_contains(said(without), {"without its multi-token prediction"});
  const plan::PublishedRun automodel =
      run("automodel", "DeepSeek-V3 671B", "NVIDIA-NeMo/Automodel docs/performance-summary.md");
  EXPECT_EQ(automodel.model.mtp_layers, 0);
  expect_contains(said(automodel), {"no multi-token prediction", "NeMo Automodel"});
  // DeepSeek's own report (a source with no stack of its own in the table) trained the depth.
  EXPECT_EQ(run("report", "DeepSeek-V3 671B", "DeepSeek-AI 2024, DeepSeek-V3 Technical Report")
                .model.mtp_layers,
            1);
  // "nano-mtp" is not "no MTP".
  EXPECT_EQ(plan::find_published_model("DeepSeek-V3 nano-mtp")->config.mtp_layers, 1);
  // The depth costs time: the same layout, one more MoE layer and one more head pass on the
  // last stage, which paces the pipeline.
  EXPECT_GT(checked.step_s, plan::check_published_run(without).step_s);

  // Its weights sit on the last pipeline rank: one MoE layer as the stack's last (attention
  // 4 h^2 of the stand-in's 128 heads of 56, two norms, the router's E x h, the shared expert's
  // 3 h f, the routed experts' E x 3 h f over ep) and the projection of [hidden; embedding]
  // (2 h x h) with its three norms (hnorm, enorm and the final one before the shared head).
  ModelConfig m = with.model;
  const plan::PlanLayout l = plan::parse_layout("tp=1,pp=16,dp=16,ep=8,zero=1,mbs=1");
  std::vector<int64_t> split(15, 4);
  split.push_back(1);
  const plan::RankParameters last = plan::rank_parameters(m, l, 15, split);
  m.mtp_layers = 0;
  const plan::RankParameters plain = plan::rank_parameters(m, l, 15, split);
  const double h = 7168, f = 2048, e = 256;
  EXPECT_DOUBLE_EQ(last.block - plain.block,
                   4 * h * h + 2 * h + e * h + 3 * h * f + 2 * h * h + 3 * h);
  EXPECT_DOUBLE_EQ(last.experts - plain.experts, e * 3 * h * f / 8);
  EXPECT_EQ(last.layers - plain.layers, 1);
  // The other ranks hold no depth.
  EXPECT_DOUBLE_EQ(plan::rank_parameters(with.model, l, 3, split).total(),
                   plan::rank_parameters(m, l, 3, split).total());
}

// The balanced split, worked by hand for DeepSeek-V3 at 4K. Its stand-in's FLOPs a token:
// matmul parameters 61 x 4 x 7168^2 (attention, 12.54B) + 3 x 3 x 7168 x 18432 (dense MLPs,
// 1.19B) + 58 x (9 x 3 x 7168 x 2048 + 256 x 7168) (8 routed and 1 shared expert and the router,
// 23.09B) + 7168 x 129280 (the head, 0.927B) = 37.75B, x 6 = 226.5 G; attention 12 x 2048 x 7168
// x 61 = 10.75 G; 237.2 G in all (Megatron-Bridge's convention gives the same). A layer's forward
// (237.2 / 3 - 1.853) / 61 = 1.266 G against the head's 2 x 7168 x 129280 = 1.853 G: 1.464
// layers; with one MTP depth the last stage carries 1 + 2 x 1.464 = 3.93 layers more.
TEST(PublishedRuns, UnevenStagesAreBalancedAgainstTheHeadAndMtp) {
  ModelConfig v3 = plan::find_published_model("DeepSeek-V3")->config;
  ASSERT_EQ(v3.mtp_layers, 1);
  EXPECT_NEAR(plan::last_stage_extra_layers(v3, 4096), 3.93, 0.005);
  auto of = [](std::initializer_list<std::pair<int64_t, int64_t>> runs) {
    std::vector<int64_t> out;
    for (const auto& [count, layers] : runs)
      out.insert(out.end(), static_cast<size_t>(count), layers);
    return out;
  };
  std::string note;
  // 16 stages: Megatron-Bridge's "Et*4|(t*4|)*14tmL", the slowest stage 4.93 layers' work (the
  // engine's 13 of 4 and 3 of 3 would leave the last 6.93).
  EXPECT_EQ(plan::balanced_stage_layers(v3, 16, 4096, &note), of({{15, 4}, {1, 1}}));
  expect_contains(note, {"head and MTP (3.9 layers' work): 15 of 4, the last 1"});
  // 32 stages: its "Et|(tt|)*30mL", a last stage of the depth and the loss alone (3.93).
  EXPECT_EQ(plan::balanced_stage_layers(v3, 32, 4096), of({{1, 1}, {30, 2}, {1, 0}}));
  // 9 stages: Llama 3's rule (63 = 9 x 7: 6, 7 x 7, 6) would leave the last 6 + 3.93 = 9.93;
  // balanced, the slowest carries 8: 7 x 7 and one 8, the last 4 (7.93).
  EXPECT_EQ(plan::balanced_stage_layers(v3, 9, 4096), of({{7, 7}, {1, 8}, {1, 4}}));
  // Without the depth (1.46 layers' work): on 16 the engine's split leaves the last 3 + 1.46;
  // balanced the last takes 2 (3.46 < 4), the first 3.
  v3.mtp_layers = 0;
  EXPECT_EQ(plan::balanced_stage_layers(v3, 16, 4096), of({{1, 3}, {14, 4}, {1, 2}}));
  // On 32 the engine's (29 of 2, 3 of 1) already paces at 2.46: kept.
  EXPECT_EQ(plan::balanced_stage_layers(v3, 32, 4096, &note), of({{29, 2}, {3, 1}}));
  expect_contains(note, {"the first 29 take one layer more"});
  // Even splits stay even; Llama 3 405B's 126 layers on 16 stages keep its own rule (7, 8 x 14,
  // 7: its sec. 3.3.2), which paces as well as any.
  EXPECT_TRUE(plan::balanced_stage_layers(v3, 61, 4096).empty());
  const ModelConfig llama = plan::find_published_model("Llama 3 405B")->config;
  EXPECT_EQ(plan::balanced_stage_layers(llama, 16, 8192, &note), of({{1, 7}, {14, 8}, {1, 7}}));
  expect_contains(note, {"first and last 7"});
}

}  // namespace
}  // namespace loom::test
