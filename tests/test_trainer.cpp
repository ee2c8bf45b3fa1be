// The training loop end to end on tiny models: loss goes down, metrics and plots are written,
// and an interrupted run resumed from its checkpoint ends with bitwise the same weights.
#include <gtest/gtest.h>

#include <fstream>

#include "loom/obs/metrics_log.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

std::vector<std::vector<float>> weights_of(Trainer& trainer) {
  std::vector<std::vector<float>> out;
  for (const Parameter* p : trainer.model().parameters()) out.push_back(p->value.to_f32_vector());
  return out;
}

class TrainerArch : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerArch, ExactResumeGivesBitwiseIdenticalWeights) {
  TinyRun straight_run("straight"), resumed_run("resumed");
  Trainer straight(parse(straight_run.config(GetParam(), 20)));
  const TrainSummary s = straight.run();
  EXPECT_EQ(s.steps_done, 20);

  // Stop after 10 steps with the 20-step schedule (as a job killed at step 10 would), then
  // let a fresh trainer resume from the step-10 checkpoint.
  TrainConfig half = parse(resumed_run.config(GetParam(), 20));
  half.steps = 10;  // schedule.total_steps stays 20
  Trainer first(half);
  EXPECT_EQ(first.run().steps_done, 10);
  Trainer second(parse(resumed_run.config(GetParam(), 20)));
  const TrainSummary r = second.run();
  EXPECT_EQ(r.first_step, 10);
  EXPECT_EQ(r.steps_done, 20);
  EXPECT_EQ(weights_of(straight), weights_of(second));  // bitwise
  EXPECT_EQ(s.last_val_loss, r.last_val_loss);
}

INSTANTIATE_TEST_SUITE_P(Archs, TrainerArch, ::testing::Values("gpt2", "llama"));

TEST(Trainer, LearnsAndWritesMetricsAndPlot) {
  TinyRun run("learns");
  // A repeating pattern is learnable: the loss must fall far below log(vocab).
  std::vector<int32_t> pattern;
  for (int i = 0; i < 6000; ++i) pattern.push_back((i * 7) % 64);
  write_token_shard(run.dir + "/data/tiny_train_000000.bin", pattern);
  write_token_shard(run.dir + "/data/tiny_train_000001.bin", pattern);
  Trainer trainer(parse(run.config("gpt2", 60), {"checkpoint.dir=\"\"", "optim.lr=1e-2"}));
  const TrainSummary s = trainer.run();
  EXPECT_LT(s.last_train_loss, 0.5);  // log(64) = 4.16 at the start
  const auto records = MetricsLog::read_all(run.dir + "/run/metrics.jsonl");
  int train_lines = 0, val_lines = 0;
  for (const auto& r : records) (r["kind"] == "train" ? train_lines : val_lines)++;
  EXPECT_EQ(train_lines, 60);
  EXPECT_EQ(val_lines, 12);
  std::ifstream svg(run.dir + "/run/loss.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
}

TEST(Trainer, Bf16MixedPrecisionKeepsFp32MasterWeightsAndTracksF32) {
  TinyRun run("bf16");
  Trainer f32(parse(run.config("llama", 10), {"checkpoint.dir=\"\""}));
  const double f32_loss = f32.run().last_train_loss;
  Trainer bf16(parse(run.config("llama", 10), {"checkpoint.dir=\"\"", "train.precision=\"bf16\""}));
  const double bf16_loss = bf16.run().last_train_loss;
  EXPECT_NEAR(bf16_loss, f32_loss, 0.05 * f32_loss);
  // Model weights are bf16 values (low 16 bits zero); the masters are not.
  for (const Parameter* p : bf16.model().parameters())
    for (float v : p->value.to_f32_vector()) ASSERT_EQ(v, round_to_bf16(v)) << p->name;
}

// Bad tensor-parallel layouts are refused when the config is read, before any work, with the
// values that would work.
TEST(TrainConfigTensorParallel, BadLayoutsAreRejectedWithWhatWorks) {
  TinyRun run("tp_config");
  const std::string llama = run.config("llama", 4);  // 4 heads, 2 kv heads, ffn 48
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.tp=4"}); }),
                  {"parallel.tp", "4", "model.n_kv_head = 2", "tp values that work: 1, 2"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.tp=0"}); }), {"parallel.tp", "expected >= 1"});
  expect_contains(error_message([&] { (void)parse(llama, {"parallel.sequence_parallel=true"}); }),
                  {"parallel.sequence_parallel", "parallel.tp = 1"});
  // A micro-batch of 3 x 15 = 45 rows does not split over 2 sequence-parallel ranks.
  expect_contains(error_message([&] {
                    (void)parse(llama, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.batch_size=3",
                                        "train.seq_len=15"});
                  }),
                  {"parallel.sequence_parallel", "= 45 rows", "parallel.tp = 2"});
  const TrainConfig ok = parse(llama, {"parallel.tp=2", "parallel.sequence_parallel=true"});
  EXPECT_EQ(ok.tp, 2);
  EXPECT_TRUE(ok.sequence_parallel);
  // One process cannot be two tp ranks: the trainer says how to launch.
  expect_contains(error_message([&] { Trainer trainer(ok); }), {"parallel.tp = 2", "mpirun -np 2"});
}

}  // namespace
}  // namespace loom::test
