// Hybrid Mamba-2 / attention stacks in the planner (ModelConfig::hybrid_pattern): NVIDIA's
// Nemotron-H, Nano 2 and Nemotron 3 presets against the parameter counts their model cards state,
// Megatron-Bridge's FLOP count of them, and the time model's mean layer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "loom/model/config.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/parallel_layout.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/published_conventions.hpp"
#include "loom/plan/published_models.hpp"
#include "loom/plan/published_runs.hpp"
#include "loom/plan/time_model.hpp"
#include "published_runs_support.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

// One MTP depth of a Nemotron 3 model as its checkpoint holds it, worked by hand: two input
// norms and the [h; embedding] -> h projection (2h + 2h^2), an attention block (its norm, q and o
// of h x q, k and v of h x kv) and a mixture-of-experts block (its norm, the router, the experts,
// the latent projections, the shared expert), and a final norm.
double mtp_depth(double h, double q, double kv, double experts, double ffn, double latent,
                 double shared) {
  const double in = latent > 0 ? latent : h;
  return 3 * h + 2 * h * h + (h + 2 * h * q + 2 * h * kv) +
         (h + experts * h + experts * 2 * in * ffn + 2 * h * latent + 2 * h * shared);
}

// Megatron-Bridge's model verification cards count every BF16 element of the checkpoints, MTP
// depth included: Nemotron 3.5 Lightning (Nemotron 3 Nano's architecture with one MTP depth)
// 32,913,266,240, Nemotron 3 Super 123,611,033,088 (examples/model_verification_cards/*/card.yaml).
TEST(PlanHybrid, NemotronPresetsHoldTheirCheckpointsParameters) {
  const plan::PublishedModel nano = *plan::find_published_model("Nemotron_3_Nano");
  EXPECT_EQ(nano.name, "Nemotron 3 Nano 30B-A3B");
  EXPECT_EQ(nano.config.n_layer, 52);
  EXPECT_EQ(nano.config.hybrid_layer_count('M'), 23);
  EXPECT_EQ(nano.config.hybrid_layer_count('E'), 23);
  EXPECT_EQ(nano.config.attention_layer_count(), 6);
  const double nano_mtp = mtp_depth(2688, 4096, 256, 128, 1856, 0, 3712);
  EXPECT_NEAR((static_cast<double>(nano.config.parameter_count()) + nano_mtp) / 32913266240.0, 1.0,
              1e-5);
  const plan::PublishedModel super = *plan::find_published_model("Nemotron_3_Super");
  EXPECT_EQ(super.name, "Nemotron 3 Super 120B-A12B");
  EXPECT_EQ(super.config.moe_latent, 1024);
  EXPECT_EQ(super.config.mtp_layers, 2);
  const double super_mtp = mtp_depth(4096, 4096, 256, 512, 2688, 1024, 5376);
  EXPECT_NEAR((static_cast<double>(super.config.parameter_count()) + super_mtp) / 123611033088.0,
              1.0, 1e-5);
  // The parameter list the memory model places over ranks sums to the same count.
  double listed = 0;
  for (const ParameterSpec& s : parameter_specs(nano.config))
    listed += static_cast<double>(s.numel());
  EXPECT_EQ(listed, static_cast<double>(nano.config.parameter_count()));

  // Names records give them; a Nano with a size is matched by the size; the 2023 dense
  // Nemotron-3 8B is not a hybrid.
  EXPECT_EQ(plan::find_published_model("Nemotron 3 Nano 30B-A3B")->name, "Nemotron 3 Nano 30B-A3B");
  EXPECT_EQ(plan::find_published_model("NVIDIA-Nemotron-Nano-9B-v2")->name, "Nemotron Nano 2 9B");
  EXPECT_EQ(plan::find_published_model("Nemotron-H-56B-Base-8K")->name, "Nemotron-H 56B");
  EXPECT_EQ(plan::find_published_model("Nemotron_3_5_Lightning")->name,
            "Nemotron 3.5 Lightning 30B-A3B");
  EXPECT_EQ(plan::find_published_model("Nemotron_3_Ultra")->name, "Nemotron 3 Ultra 550B-A55B");
  EXPECT_FALSE(plan::find_published_model("Nemotron-3 8B")->config.is_hybrid());
  EXPECT_FALSE(plan::find_published_model("Nemotron 3 Nano 4B").has_value());
  // The Llama-based Nemotrons of 2025 are none of these: a variant needs its stated size too.
  for (const char* llama_based : {"Nemotron Super 49B", "Nemotron Ultra 253B", "Nemotron Nano 8B"})
    EXPECT_FALSE(plan::find_published_model(llama_based).has_value()) << llama_based;
  EXPECT_EQ(plan::find_published_model("Nemotron-4 340B on a DGX SuperPOD")->name,
            "Nemotron-4 340B");
}

ModelConfig tiny_hybrid(const std::string& pattern) {
  ModelConfig m;
  m.arch = Architecture::Llama;
  m.n_layer = static_cast<int64_t>(pattern.size());
  m.n_embd = 256;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn_hidden = 512;
  m.vocab_size = 1000;
  m.tied_embeddings = false;
  m.squared_relu_mlp = true;
  m.hybrid_pattern = pattern;
  if (pattern.find('M') != std::string::npos) {
    m.mamba_heads = 8;
    m.mamba_head_dim = 64;
    m.mamba_state = 64;
    m.mamba_groups = 2;
  }
  return m;
}

// What a pattern must be, named before any work; and the engine, which trains transformers,
// refuses a hybrid rather than build something else.
TEST(PlanHybrid, APatternIsCheckedAndTheEngineRefusesHybrids) {
  expect_contains(error_message([] { tiny_hybrid("M*X-").validate(); }),
                  {"model.hybrid_pattern", "'X'"});
  ModelConfig wrong_length = tiny_hybrid("M*-");
  wrong_length.n_layer = 4;
  expect_contains(error_message([&] { wrong_length.validate(); }),
                  {"3 symbols for model.n_layer = 4"});
  expect_contains(error_message([] { tiny_hybrid("M*E-").validate(); }),
                  {"1 E layers with model.n_experts = 0"});
  ModelConfig no_mamba = tiny_hybrid("M*-");
  no_mamba.mamba_heads = 0;
  expect_contains(error_message([&] { no_mamba.validate(); }),
                  {"model.mamba_heads", "for the M layers"});
  EXPECT_NO_THROW(tiny_hybrid("M*-").validate());
  ModelConfig transformer = tiny_hybrid("*-");
  transformer.hybrid_pattern.clear();
  transformer.n_layer = 1;
  expect_contains(error_message([&] { transformer.validate(); }),
                  {"model.squared_relu_mlp", "hybrid Mamba stacks only"});
  // Mamba-2 mixers split over tp by heads and by groups: 8 heads in 2 groups take tp 2, not 4.
  EXPECT_NO_THROW(
      check_layout(plan::parse_layout("tp=2,dp=4"), tiny_hybrid("M*-"), 1024, LayoutRules::Valid));
  expect_contains(
      error_message([] {
        check_layout(plan::parse_layout("tp=4,dp=2"), tiny_hybrid("M*-"), 1024, LayoutRules::Valid);
      }),
      {"Mamba-2 mixers' 8 heads in 2 groups do not split over tp=4", "tp values that work: 1, 2"});
  expect_contains(error_message([] { Transformer t(tiny_hybrid("M*-"), Recompute::None, 1000); }),
                  {"for `loom plan` only"});
  // Multi-token prediction is planned on any model (DeepSeek-V3's depth), trained on none.
  ModelConfig mtp = transformer;
  mtp.squared_relu_mlp = false;
  mtp.mtp_layers = 1;
  EXPECT_NO_THROW(mtp.validate());
  EXPECT_NO_THROW(check_layout(plan::parse_layout("dp=2"), mtp, 1024, LayoutRules::Valid));
  expect_contains(error_message([&] {
                    check_layout(plan::parse_layout("dp=2"), mtp, 1024, LayoutRules::Engine);
                  }),
                  {"model.mtp_layers = 1", "planned, not trained"});
  expect_contains(error_message([&] { Transformer t(mtp, Recompute::None, 1000); }),
                  {"for `loom plan` only"});
}

// Megatron-Bridge's hybrid FLOP count (flop_utils.py hybrid_flops), worked by hand for "M*-" at
// h = 256, 4 heads of 64 (q 256), 2 kv heads (kv 128), MLP 512 (squared ReLU), Mamba 8 heads,
// state 64, 2 groups, vocabulary 1000, s = 1024, per token forward:
//   attention 4h(q + kv) + 2 q s = 4*256*384 + 2*256*1024 = 393,216 + 524,288 = 917,504
//   Mamba (d_in taken as 2h = 512) 2h(2 d_in + 2 G N + heads) + 7 d_in N + 2 d_in h
//     = 512*(1024 + 256 + 8) + 7*512*64 + 2*512*256 = 659,456 + 229,376 + 262,144 = 1,150,976
//   MLP 4 f h = 524,288; head 2 h V = 512,000; sum 3,104,768, x3 = 9,314,304.
TEST(PlanHybrid, MegatronBridgeCountsAHybridsFlopsAsItsFormulaDoes) {
  EXPECT_DOUBLE_EQ(plan::megatron_hybrid_flops_per_token(tiny_hybrid("M*-"), 1024), 9314304.0);
  // The source's own figures agree: its Nemotron 3 Nano row on 8 GB300s (26.04) gives 849 TFLOP/s
  // per GPU at 38,100 tokens/s, 22.28 GFLOP a token at 8K.
  const plan::PublishedModel nano = *plan::find_published_model("Nemotron_3_Nano");
  EXPECT_NEAR(plan::megatron_hybrid_flops_per_token(nano.config, 8192) / (849e12 / 38100), 1.0,
              0.01);
}

// A hybrid of alternating attention and MLP blocks is a transformer cut at its mid residual: the
// same GEMMs, stash and collectives (two blocks of one all-reduce pair each for a layer's two), so
// the same step.
TEST(PlanHybrid, AlternatingAttentionAndMlpBlocksStepAsATransformer) {
  ModelConfig hybrid = tiny_hybrid("*-*-*-*-");
  hybrid.squared_relu_mlp = false;  // SwiGLU MLP blocks, as the transformer's
  ModelConfig transformer = hybrid;
  transformer.hybrid_pattern.clear();
  transformer.n_layer = 4;
  EXPECT_EQ(hybrid.parameter_count(), transformer.parameter_count());
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = 1024;
  job.global_batch = 16;
  const plan::ClusterSpec cluster;
  for (const char* layout :
       {"dp=8,zero=1", "tp=2,dp=4,zero=1", "tp=2,dp=4,zero=1,recompute=full"}) {
    SCOPED_TRACE(layout);
    const plan::PlanLayout l = plan::parse_layout(layout);
    const plan::StepTime a = plan::predict_step_time(hybrid, l, cluster, job);
    const plan::StepTime b = plan::predict_step_time(transformer, l, cluster, job);
    EXPECT_NEAR(a.compute_s / b.compute_s, 1.0, 1e-9);
    EXPECT_NEAR(a.tp_comm_s, b.tp_comm_s, 1e-12);
    // The step's exposed data-parallel traffic differs a little: its buckets close block by block.
    EXPECT_NEAR(a.total_s / b.total_s, 1.0, 0.01);
  }
  // Mamba blocks cost their GEMMs and scans: a Mamba block in place of each MLP block is slower
  // by in_proj and out_proj (256 x 1,288 and 512 x 256: 921,600 FLOPs a token, against the
  // SwiGLU MLP's 3 x 256 x 512: 786,432) and the scans.
  const plan::StepTime mamba = plan::predict_step_time(
      tiny_hybrid("*M*M*M*M"), plan::parse_layout("dp=8,zero=1"), cluster, job);
  const plan::StepTime mlp =
      plan::predict_step_time(hybrid, plan::parse_layout("dp=8,zero=1"), cluster, job);
  EXPECT_GT(mamba.compute_s, mlp.compute_s);
}

}  // namespace
}  // namespace loom::test
