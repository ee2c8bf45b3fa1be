// Bad steps ([bad_steps], train/bad_steps): the verdict by hand, config errors, a NaN step that
// leaves every piece of state where the previous step left it, and spikes that roll the run
// back to its checkpoint and end it where a run on data without those batches ends.
#include <gtest/gtest.h>

#include <cmath>

#include "bad_steps_fixture.hpp"
#include "loom/core/error.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/bad_steps.hpp"
#include "loom/train/stragglers.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// Every parameter's value and every piece of optimizer state (moments, masters), in order.
std::vector<std::vector<float>> state_of(Trainer& trainer) {
  std::vector<std::vector<float>> out;
  for (const Parameter* p : trainer.model().parameters()) out.push_back(p->value.to_f32_vector());
  for (const OwnedSlice& s : trainer.optimizer().owned_slices()) {
    out.push_back(s.exp_avg.to_f32_vector());
    out.push_back(s.exp_avg_sq.to_f32_vector());
    if (s.master.defined()) out.push_back(s.master.to_f32_vector());
  }
  return out;
}

std::vector<nlohmann::json> train_records(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& r : MetricsLog::read_all(metrics))
    if (r["kind"] == "train") out.push_back(r);
  return out;
}

TEST(BadStepGuard, JudgesByHand) {
  BadStepGuard guard({true, 2.0, 3, 2, 1});
  EXPECT_EQ(guard.judge(NAN, 1.0).kind, BadStep::NonFiniteLoss);
  EXPECT_EQ(guard.judge(INFINITY, 1.0).kind, BadStep::NonFiniteLoss);
  EXPECT_EQ(guard.judge(4.0, NAN).kind, BadStep::NonFiniteNorm);
  EXPECT_EQ(guard.judge(4.0, -INFINITY).kind, BadStep::NonFiniteNorm);
  // No spike test until the window holds 3 losses.
  guard.record(false, 4.0);
  guard.record(false, 6.0);
  EXPECT_EQ(guard.median(), 0.0);
  EXPECT_FALSE(guard.judge(1000.0, 1.0).bad());
  guard.record(false, 5.0);
  EXPECT_EQ(guard.median(), 5.0);              // median of {4, 6, 5}
  EXPECT_FALSE(guard.judge(10.0, 1.0).bad());  // not above 2 x 5
  const BadStepVerdict spike = guard.judge(10.5, 1.0);
  EXPECT_EQ(spike.kind, BadStep::LossSpike);
  EXPECT_NE(spike.reason.find("median 5"), std::string::npos) << spike.reason;
  // A bad step leaves the window alone; a good one pushes the oldest out: {6, 5, 7} -> 6.
  guard.record(true, 10.5);
  EXPECT_EQ(guard.median(), 5.0);
  EXPECT_EQ(guard.bad_in_a_row(), 1);
  EXPECT_FALSE(guard.rollback_due());
  guard.record(true, 11.0);
  EXPECT_TRUE(guard.rollback_due());
  EXPECT_EQ(guard.skipped_total(), 2);
  guard.count_rollback(7);
  EXPECT_EQ(guard.bad_in_a_row(), 0);
  guard.record(false, 7.0);
  EXPECT_EQ(guard.median(), 6.0);
  // max_rollbacks = 1: the second one is an error naming the key.
  guard.record(true, 20.0);
  guard.record(true, 20.0);
  try {
    guard.count_rollback(9);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad_steps.max_rollbacks = 1"), std::string::npos)
        << e.what();
  }
  // An even window's median is the mean of the middle two: {1, 2, 3, 4} -> 2.5.
  BadStepGuard even({true, 2.0, 4, 0, 1});
  for (double loss : {4.0, 1.0, 3.0, 2.0}) even.record(false, loss);
  EXPECT_EQ(even.median(), 2.5);
  // The state round-trips.
  BadStepGuard copy({true, 2.0, 4, 0, 1});
  copy.restore(even.state());
  EXPECT_EQ(copy.median(), 2.5);
}

TEST(BadStepConfig, BadKeysAreRefusedBeforeAnyWork) {
  TinyRun run("bad_steps_config");
  const std::string base = run.config("gpt2", 10);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"bad_steps.loss_spike_factor=0.5"}, "bad_steps.loss_spike_factor"},
      {{"bad_steps.median_window=0"}, "bad_steps.median_window"},
      {{"bad_steps.rollback_after=-1"}, "bad_steps.rollback_after"},
      {{"bad_steps.rollback_after=2", "checkpoint.dir=\"\""}, "checkpoint.dir is not set"},
      {{"bad_steps.skip=false", "bad_steps.loss_spike_factor=3"}, "bad_steps.skip"},
      {{"debug.inject_nan_at_steps=[0]"}, "debug.inject_nan_at_steps"},
      {{"debug.inject_loss_spike_at_steps=[11]"}, "train.steps = 10"},
      {{"debug.inject_loss_spike_scale=0"}, "debug.inject_loss_spike_scale"},
      {{"bad_steps.typo=1"}, "bad_steps.typo"},
  };
  for (const auto& [overrides, expected] : cases) {
    try {
      (void)parse(base, overrides);
      ADD_FAILURE() << overrides.back() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << overrides.back() << ": " << e.what();
    }
  }
}

struct NanCase {
  std::string name;
  std::vector<std::string> overrides;
};
void PrintTo(const NanCase& c, std::ostream* os) { *os << c.name; }
class BadStepsNan : public ::testing::TestWithParam<NanCase> {};

// A NaN gradient at step 4: the state after step 4 is the state after step 3 bit for bit (weights,
// moments, masters, AdamW's step count, MoE biases), and the run goes on with one skipped step.
TEST_P(BadStepsNan, LeavesTheStateOfThePreviousStepAndGoesOn) {
  const NanCase c = GetParam();
  TinyRun run("nan_" + c.name);
  std::vector<std::string> shared = c.overrides;
  shared.insert(shared.end(), {"data.val=\"\"", "checkpoint.dir=\"\""});
  const std::string base = run.config(c.name == "moe" ? "llama" : "gpt2", 8);
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), shared.begin(), shared.end());
    return parse(base, extra);
  };
  TrainConfig three = with({"log.dir=\"" + run.dir + "/three\""});
  three.steps = 3;  // the 8-step schedule, stopped after step 3
  Trainer before(three);
  before.run();
  TrainConfig four = with({"debug.inject_nan_at_steps=[4]", "log.dir=\"" + run.dir + "/four\""});
  four.steps = 4;
  Trainer at(four);
  const TrainSummary summary = at.run();
  EXPECT_EQ(summary.skipped_steps, 1);
  EXPECT_EQ(state_of(at), state_of(before));  // bitwise
  EXPECT_EQ(at.optimizer().steps_taken(), 3);
  EXPECT_EQ(at.model().moe_biases(), before.model().moe_biases());
  const auto records = train_records(run.dir + "/four/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  EXPECT_TRUE(records[3]["grad_norm"].is_null()) << records[3];  // NaN is written as null
  EXPECT_TRUE(records[3]["loss"].is_number()) << records[3];     // the forward was fine
  EXPECT_EQ(records[3].value("skipped", false), true);
  EXPECT_EQ(records[3]["skipped_steps"], 1);
  EXPECT_EQ(records[2]["skipped_steps"], 0);
  // Its data: from the sequence after three steps of 4 rows x 2 micro-batches.
  EXPECT_EQ(records[3]["data_position"]["sequences"], 3 * 4 * 2) << records[3];

  // The whole run goes on: 8 steps, one skipped, every later step updates.
  Trainer whole(with({"debug.inject_nan_at_steps=[4]", "log.dir=\"" + run.dir + "/whole\""}));
  const TrainSummary w = whole.run();
  EXPECT_EQ(w.steps_done, 8);
  EXPECT_EQ(w.skipped_steps, 1);
  EXPECT_EQ(whole.optimizer().steps_taken(), 7);
  EXPECT_TRUE(std::isfinite(w.last_train_loss));
  int skipped = 0;
  for (const auto& r : train_records(run.dir + "/whole/metrics.jsonl"))
    skipped += r.value("skipped", false) ? 1 : 0;
  EXPECT_EQ(skipped, 1);
  EXPECT_NE(state_of(whole), state_of(at));

  // The injection is real: without skipping, the NaN update poisons the weights and the next
  // step's loss stops the run.
  Trainer unguarded(with({"debug.inject_nan_at_steps=[4]", "bad_steps.skip=false",
                          "log.dir=\"" + run.dir + "/off\""}));
  try {
    unguarded.run();
    FAIL() << "expected the run to stop";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("training diverged: loss is "), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("nan at step 5"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, BadStepsNan,
    ::testing::Values(NanCase{"gpt2", {}}, NanCase{"bf16", {"train.precision=\"bf16\""}},
                      NanCase{"moe",
                              {"model.n_experts=4", "model.experts_per_token=2",
                               "model.moe_router=\"sigmoid\"", "model.moe_bias_rate=0.01"}}),
    [](const ::testing::TestParamInfo<NanCase>& info) { return info.param.name; });

// Spikes at steps 5 and 6 with rollback_after = 2: the run returns to its step-3 checkpoint and
// skips the batches read since it (steps 4-6: loader batches 6-11 at grad_accum 2), so it ends
// bit for bit where a run ends whose shards simply lack those six batches.
TEST(BadStepsRollback, EndsWhereTheDataWithoutTheSkippedBatchesEnds) {
  TinyRun run("rollback");
  constexpr int64_t kBatchTokens = 4 * 16;  // train.batch_size x train.seq_len
  write_batch_shards(run.dir + "/all", 30, kBatchTokens, 64);
  write_batch_shards(run.dir + "/omitted", 30, kBatchTokens, 64, batch_range(6, 6));
  const std::string base = run.config("gpt2", 10);
  const std::vector<std::string> shared = {"data.val=\"\"",
                                           "data.shuffle=false",
                                           "checkpoint.every=3",
                                           "checkpoint.keep_last=10",
                                           "bad_steps.loss_spike_factor=3",
                                           "bad_steps.median_window=2",
                                           "bad_steps.rollback_after=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), shared.begin(), shared.end());
    return parse(base, extra);
  };
  Trainer spiky(
      with({"data.train=\"" + run.dir + "/all/*.bin\"", "debug.inject_loss_spike_at_steps=[5, 6]",
            "checkpoint.dir=\"" + run.dir + "/ckpt_spiky\"", "log.dir=\"" + run.dir + "/spiky\""}));
  const TrainSummary s = spiky.run();
  Trainer reference(
      with({"data.train=\"" + run.dir + "/omitted/*.bin\"",
            "checkpoint.dir=\"" + run.dir + "/ckpt_ref\"", "log.dir=\"" + run.dir + "/ref\""}));
  const TrainSummary r = reference.run();

  EXPECT_EQ(s.rollbacks, 1);
  EXPECT_EQ(s.skipped_steps, 2);
  EXPECT_EQ(r.skipped_steps, 0);
  EXPECT_EQ(s.steps_done, 10);
  EXPECT_EQ(spiky.optimizer().steps_taken(), 10);
  EXPECT_EQ(state_of(spiky), state_of(reference));  // bitwise

  // The log: steps 1-6 (5 and 6 skipped), the rollback to step 3, then steps 4-10 with the
  // reference's losses.
  std::vector<nlohmann::json> records = MetricsLog::read_all(run.dir + "/spiky/metrics.jsonl");
  std::vector<int64_t> steps;
  for (const auto& rec : records)
    if (rec["kind"] == "train") steps.push_back(rec["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9, 10}));
  bool saw_rollback = false;
  for (const auto& rec : records)
    if (rec["kind"] == "rollback") {
      saw_rollback = true;
      EXPECT_EQ(rec["step"], 6);
      EXPECT_EQ(rec["to_step"], 3);
      EXPECT_EQ(rec["data_resumes_at"]["sequences"], 6 * 2 * 4) << rec;  // 6 steps x 2 batches x 4 rows read
    }
  EXPECT_TRUE(saw_rollback);
  const auto ref_losses = losses_of(run.dir + "/ref/metrics.jsonl");
  const auto spiky_records = train_records(run.dir + "/spiky/metrics.jsonl");
  ASSERT_EQ(spiky_records.size(), 13u);
  for (size_t i = 6; i < 13; ++i)
    EXPECT_EQ(spiky_records[i]["loss"].get<double>(), ref_losses[i - 3]) << i;
  EXPECT_EQ(spiky_records[4].value("skipped", false), true);
  EXPECT_EQ(spiky_records[5].value("skipped", false), true);
  EXPECT_EQ(spiky_records.back()["skipped_steps"], 2);
}

TEST(BadStepsRollback, TooManyRollbacksStopTheRun) {
  TinyRun run("rollback_limit");
  Trainer trainer(parse(run.config("gpt2", 10),
                        {"data.val=\"\"", "bad_steps.loss_spike_factor=3",
                         "bad_steps.median_window=2", "bad_steps.rollback_after=2",
                         "bad_steps.max_rollbacks=0", "debug.inject_loss_spike_at_steps=[5, 6]"}));
  try {
    trainer.run();
    FAIL() << "expected the run to stop";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("training keeps diverging: 2 bad steps in a row up to step 6"),
        std::string::npos)
        << e.what();
  }
}

// Stragglers (train/stragglers): the comparison by hand.
TEST(Stragglers, SlowestRankAgainstTheMedianByHand) {
  // {10, 12, 30, 11} ms: sorted {10, 11, 12, 30}, median (11 + 12) / 2 = 11.5, rank 2 lags by
  // 30 / 11.5 - 1 = 1.6087.
  const RankTimes t = compare_rank_times({0.010, 0.012, 0.030, 0.011}, 0.5);
  EXPECT_DOUBLE_EQ(t.median_s, 0.0115);
  EXPECT_DOUBLE_EQ(t.min_s, 0.010);
  EXPECT_DOUBLE_EQ(t.max_s, 0.030);
  EXPECT_EQ(t.slowest_rank, 2);
  EXPECT_NEAR(t.lag, 30.0 / 11.5 - 1.0, 1e-12);
  EXPECT_TRUE(t.straggler);
  EXPECT_FALSE(compare_rank_times({0.010, 0.012, 0.030, 0.011}, 2.0).straggler);  // 1.61 <= 2
  EXPECT_FALSE(compare_rank_times({0.010, 0.012, 0.030, 0.011}, 0.0).straggler);  // off
  // Odd count: the middle one; one rank: never behind itself.
  EXPECT_DOUBLE_EQ(compare_rank_times({3.0, 1.0, 2.0}, 0.1).median_s, 2.0);
  EXPECT_FALSE(compare_rank_times({5.0}, 0.1).straggler);
}

}  // namespace
}  // namespace loom::test
