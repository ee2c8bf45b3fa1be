// FP8 training end to end on the tiny GPT-2 (model/fp8_linear.hpp): each recipe learns the
// Markov stream and tracks f32 within a band derived from E4M3's precision; a run stopped and
// resumed gives the uninterrupted run's losses, weights and amax histories bit for bit; bad
// FP8 configs are refused before any work, naming what works.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <tuple>

#include "loom/core/device_memory.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// Tolerance, from E4M3's precision, by the argument of test_trainer.cpp's bf16 band. E4M3 keeps 4
// significant bits: rounding to nearest moves a value by at most 2^-4 relative, with an RMS over a
// binade of about 0.42 x 2^-4 = 2^-5. From token to loss the FP8 model rounds K = 8 n_layer values
// in series: the input and the weight of each of a block's four GEMMs (q|k|v, attention output,
// MLP up and down); everything else is f32. Independent roundings add as a random walk, so the
// logits carry a relative error rho = sqrt(K) 2^-5, and, as for bf16, the loss at every step is
// within rho ln V of f32's: 0.52 nats for the 2-layer model and V = 64. (The gradients' E5M2
// roundings, 2^-3 at most, only steer the updates, which the bf16 argument folds into the same
// rho ln V.) A test with the control below shows the band can fail.
double fp8_loss_band(const ModelConfig& model) {
  const double roundings_in_series = 8.0 * static_cast<double>(model.n_layer);
  return std::sqrt(roundings_in_series) * std::ldexp(1.0, -5) *
         std::log(static_cast<double>(model.vocab_size));
}

double largest_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0;
  for (size_t s = 0; s < a.size() && s < b.size(); ++s) gap = std::max(gap, std::fabs(a[s] - b[s]));
  return gap;
}

auto trained(const TinyRun& run, const std::string& base, const std::string& name,
             std::vector<std::string> overrides) {
  overrides.push_back("log.dir=\"" + run.dir + "/" + name + "\"");
  overrides.push_back("checkpoint.dir=\"\"");
  auto trainer = std::make_unique<Trainer>(parse(base, overrides));
  const TrainSummary summary = trainer->run();
  return std::make_tuple(std::move(trainer), summary,
                         losses_of(run.dir + "/" + name + "/metrics.jsonl"));
}

class Fp8Recipes : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Recipes, LearnsAndTracksF32WithinE4M3Precision) {
  TinyRun run("fp8_" + GetParam());
  run.write_learnable_shards();
  const std::string base = run.config("gpt2", kLearnableSteps);
  const auto [f32, f32_summary, f32_losses] = trained(run, base, "f32", {kLearnableLr});
  const auto [fp8, fp8_summary, fp8_losses] =
      trained(run, base, "fp8",
              {kLearnableLr, "train.precision=\"fp8\"", "train.fp8_recipe=\"" + GetParam() + "\""});
  ASSERT_EQ(f32_losses.size(), static_cast<size_t>(kLearnableSteps));
  ASSERT_EQ(fp8_losses.size(), f32_losses.size());
  const double initial_loss = std::log(64.0);
  EXPECT_NEAR(fp8_losses.front(), initial_loss, 0.05 * initial_loss);
  EXPECT_LT(fp8_summary.last_train_loss, 0.45 * initial_loss);  // learns (f32: ~1.2-1.4 nats)
  const double band = fp8_loss_band(f32->model().config());
  const double gap = largest_gap(f32_losses, fp8_losses);
  EXPECT_LT(gap, band) << "band " << band << " nats";
  ASSERT_TRUE(f32_summary.last_val_loss && fp8_summary.last_val_loss);
  EXPECT_NEAR(*fp8_summary.last_val_loss, *f32_summary.last_val_loss, band);
  // The GEMMs really ran on FP8 operands: the losses are not f32's.
  EXPECT_GT(gap, 1e-4);
  RecordProperty("fp8_vs_f32_largest_gap_nats", std::to_string(gap));
  std::printf("fp8 %s: largest gap to f32 %.4f nats (band %.3f); final loss %.4f vs f32 %.4f\n",
              GetParam().c_str(), gap, band, fp8_summary.last_train_loss,
              f32_summary.last_train_loss);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Recipes, ::testing::Values("delayed", "current", "blockwise"));

// The band can fail: f32 at a third of the learning rate leaves it.
TEST(Fp8TrainingBand, AnF32RunAtAThirdOfTheLearningRateLeavesTheBand) {
  TinyRun run("fp8_band");
  run.write_learnable_shards();
  const std::string base = run.config("gpt2", kLearnableSteps);
  const auto [f32, f32_summary, f32_losses] = trained(run, base, "f32", {kLearnableLr});
  const auto [slow, slow_summary, slow_losses] = trained(run, base, "slow", {"optim.lr=3.3e-3"});
  EXPECT_GT(largest_gap(f32_losses, slow_losses), fp8_loss_band(f32->model().config()));
}

// 12 steps straight == 6 steps, stop, resume 6: losses, weights and every amax history bitwise.
TEST(Fp8Resume, RestoresTheAmaxHistoryBitwise) {
  TinyRun straight_run("fp8_straight"), resumed_run("fp8_resumed");
  const std::vector<std::string> fp8 = {"train.precision=\"fp8\"", "train.fp8_recipe=\"delayed\"",
                                        "train.fp8_amax_history=4", "checkpoint.every=6"};
  Trainer straight(parse(straight_run.config("gpt2", 12), fp8));
  EXPECT_EQ(straight.run().steps_done, 12);
  TrainConfig half = parse(resumed_run.config("gpt2", 12), fp8);
  half.steps = 6;  // schedule.total_steps stays 12
  Trainer first(half);
  EXPECT_EQ(first.run().steps_done, 6);
  Trainer second(parse(resumed_run.config("gpt2", 12), fp8));
  const TrainSummary r = second.run();
  EXPECT_EQ(r.first_step, 6);
  ASSERT_NE(straight.model().fp8(), nullptr);
  const std::vector<float> history = straight.model().fp8()->amax_history();
  EXPECT_EQ(history, second.model().fp8()->amax_history());  // bitwise
  EXPECT_GT(*std::max_element(history.begin(), history.end()), 0.0f);
  for (size_t i = 0; i < straight.model().parameters().size(); ++i)
    EXPECT_EQ(straight.model().parameters()[i]->value.to_f32_vector(),
              second.model().parameters()[i]->value.to_f32_vector());
  const std::vector<double> a = losses_of(straight_run.dir + "/run/metrics.jsonl");
  const std::vector<double> b = losses_of(resumed_run.dir + "/run/metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  EXPECT_EQ(a, b);
}

TEST(Fp8Config, BadKeysAndLayoutsAreRefusedWithWhatWorks) {
  TinyRun run("fp8_config");
  const std::string gpt2 = run.config("gpt2", 4);
  const std::string fp8 = "train.precision=\"fp8\"";
  expect_contains(error_message([&] { (void)parse(gpt2, {"train.fp8_recipe=\"delayed\""}); }),
                  {"train.fp8_recipe", "train.precision", "\"fp8\""});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, "train.fp8_recipe=\"tensorwise\""});
                  }),
                  {"train.fp8_recipe", "tensorwise", "delayed, current or blockwise"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, "train.fp8_format=\"e5m2\""});
                  }),
                  {"train.fp8_format", "e5m2", "hybrid", "e4m3"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, "train.fp8_amax_history=0"});
                  }),
                  {"train.fp8_amax_history", "0", "1 to 1024"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, "train.fp8_margin=-1"});
                  }),
                  {"train.fp8_margin", "-1", "0 to 30"});
  expect_contains(error_message([&] { (void)parse(gpt2, {"train.precision=\"fp16\""}); }),
                  {"train.precision", "fp16", "f32, bf16 or fp8"});
  // tp, pp and cp take every recipe whose tiles their slices keep whole (tests/dist/
  // test_fp8_model_parallel.cpp trains them); blockwise tiles are 128 wide, so a tp slice of
  // GPT-2's 128-wide MLP (32 x 4 / 2 = 64) or a cp chunk of 16 / 4 = 4 tokens would cut them.
  for (const char* layout : {"parallel.tp=2", "parallel.pp=2", "parallel.cp=2"})
    EXPECT_NO_THROW((void)parse(gpt2, {fp8, layout, "train.fp8_recipe=\"current\""})) << layout;
  expect_contains(
      error_message([&] {
        (void)parse(gpt2, {fp8, "parallel.tp=2", "train.fp8_recipe=\"blockwise\""});
      }),
      {"parallel.tp = 2", "model.ffn_hidden / parallel.tp = 64", "multiple of 128", "delayed"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, "parallel.cp=2", "train.fp8_recipe=\"blockwise\""});
                  }),
                  {"parallel.cp = 2", "seq_len / 2cp = 4", "multiple of 128"});
  EXPECT_NO_THROW((void)parse(gpt2, {fp8, "parallel.cp=2", "train.fp8_recipe=\"blockwise\"",
                                     "train.seq_len=512", "model.max_seq_len=512"}));
  // On CUDA: every GEMM dimension a multiple of 16 (cuBLASLt); blockwise, of its 128-element
  // tiles, the sequence length included (the weight gradients' 128 x 1 tiles stay inside one).
  const std::string cuda = "train.device=\"cuda\"";
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, cuda, "train.fp8_recipe=\"blockwise\""});
                  }),
                  {"blockwise", "CUDA", "train.seq_len = 16", "multiple of 128", "delayed"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, cuda, "train.fp8_recipe=\"blockwise\"",
                                       "train.seq_len=128", "model.max_seq_len=128"});
                  }),
                  {"blockwise", "model.n_embd", "multiple of 128"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, cuda, "train.seq_len=10"});
                  }),
                  {"tokens per micro-batch", "40", "multiple of 16"});
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, cuda, "model.n_embd=40", "model.n_head=4"});
                  }),
                  {"model.n_embd", "40", "multiple of 16"});
  // Each rank's slice and tokens: at tp 4 GPT-2's 128-wide MLP is 32 a rank (fine), its
  // 32-wide attention 8 (not); at cp 2 a rank holds 48 / 2 = 24 tokens of a micro-batch.
  expect_contains(error_message([&] {
                    (void)parse(gpt2, {fp8, cuda, "parallel.tp=4"});
                  }),
                  {"query width", "/ parallel.tp = 8", "multiple of 16"});
  expect_contains(
      error_message([&] {
        (void)parse(gpt2, {fp8, cuda, "parallel.cp=2", "train.seq_len=12", "train.batch_size=4"});
      }),
      {"/ parallel.cp", "24", "multiple of 16"});
  TrainConfig blockwise = parse(gpt2, {fp8, "train.fp8_recipe=\"blockwise\""});
  blockwise.device = Device::CUDA;  // a config handed to the trainer directly is checked there too
  expect_contains(error_message([&] { Trainer trainer(blockwise); }),
                  {"blockwise", "CUDA", "multiple of 128"});
  // A CUDA FP8 config the engine takes gets as far as looking for the GPU.
  if (device_memory::cuda_device_count() == 0)
    expect_contains(error_message([&] {
                      Trainer trainer(parse(gpt2, {fp8, cuda}));
                    }),
                    {"train.device = \"cuda\""});
  // Experts train in FP8 too (test_fp8_moe.cpp); on CUDA their width is a GEMM dimension.
  const std::string llama = run.config("llama", 4);
  EXPECT_NO_THROW((void)parse(llama, {fp8, "model.n_experts=4", "model.experts_per_token=2"}));
  expect_contains(error_message([&] {
                    (void)parse(llama, {fp8, cuda, "model.n_experts=4", "model.experts_per_token=2",
                                        "model.moe_ffn_hidden=24"});
                  }),
                  {"the experts' width", "24", "multiple of 16"});
  const TrainConfig ok =
      parse(gpt2, {fp8, "train.fp8_recipe=\"blockwise\"", "train.fp8_format=\"e4m3\"",
                   "train.fp8_amax_history=8", "train.fp8_margin=2"});
  EXPECT_EQ(ok.precision, Precision::FP8);
  EXPECT_EQ(ok.fp8.recipe, Fp8Recipe::Blockwise);
  EXPECT_EQ(ok.fp8.formats, Fp8Formats::E4M3);
  EXPECT_EQ(ok.fp8.amax_history, 8);
  EXPECT_EQ(ok.fp8.margin, 2);
}

}  // namespace
}  // namespace loom::test
