// Pipeline parallelism around the model: the measured bubble of a step's timeline against the
// textbook one, and `parallel.pp*` config keys refused when read, each error saying what works.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/parallel/pipeline_schedule.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/train/pipeline_report.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

using Timings = std::vector<std::vector<ActionTiming>>;

// The simulated timeline as the executor would have timed it, per rank.
Timings timings_of(const plan::PipelineTimeline& timeline, int64_t p) {
  Timings ranks(static_cast<size_t>(p));
  for (const auto& s : timeline.spans)
    ranks[static_cast<size_t>(s.rank)].push_back({s.op, s.micro_batch, s.chunk, s.start, s.end});
  return ranks;
}

plan::PipelineTimeline simulate(PipelineSchedule schedule, int64_t p, int64_t m, int64_t v, double p2p = 0) {
  // One time unit per chunk forward and per chunk backward.
  return plan::simulate_pipeline(pipeline_actions(schedule, p, m, v), p, v, 1, 1, p2p);
}

TEST(PipelineBubble, MeasuredOnASimulatedTimelineIsTheTextbookBubble) {
  for (PipelineSchedule s : {PipelineSchedule::AllForwardAllBackward, PipelineSchedule::OneFOneB}) {
    SCOPED_TRACE(schedule_name(s));
    const auto timeline = simulate(s, 4, 8, 1);
    // m + p - 1 = 11 slots of forward + backward: each rank computes 16 and idles 6, 6 / 16 = 3 / 8.
    EXPECT_DOUBLE_EQ(timeline.makespan, 22.0);
    EXPECT_DOUBLE_EQ(textbook_bubble(s, 4, 8, 1), 3.0 / 8.0);
    EXPECT_NEAR(measured_bubble(timings_of(timeline, 4)), textbook_bubble(s, 4, 8, 1), 1e-9);
  }
  // Interleaved, p = 2, v = 2, m = 4, replayed by hand from the two ranks' action lists: rank 0
  // idles in [12, 13) (waiting for B2 of stage 3) and [14, 15) (B3), rank 1 in [0, 1) (F0 of
  // stage 0) and [17, 18) (B3 of stage 0 is the last action): each rank computes 16 units and
  // idles 2 of a makespan of 18. 2 / 16 = 1 / 8 = (p - 1) / (v m): the textbook holds exactly.
  const auto interleaved = simulate(PipelineSchedule::Interleaved, 2, 4, 2);
  EXPECT_DOUBLE_EQ(interleaved.makespan, 18.0);
  EXPECT_DOUBLE_EQ(textbook_bubble(PipelineSchedule::Interleaved, 2, 4, 2), 1.0 / 8.0);
  EXPECT_NEAR(measured_bubble(timings_of(interleaved, 2)), 1.0 / 8.0, 1e-9);
  // Paying for each hop between ranks only adds idle time.
  EXPECT_GT(measured_bubble(timings_of(simulate(PipelineSchedule::OneFOneB, 4, 8, 1, 0.25), 4)), 3.0 / 8.0);
}

TEST(PipelineBubble, HandMadeTimelineCountsIdleOverBusyPerRank) {
  // Window [10, 16). Rank 0 works [10, 12) and [14, 16): idle 2 over busy 4. Rank 1 works
  // [12, 14) only: idle 4 over busy 2. Mean of 0.5 and 2.
  const Timings ranks = {{{PipeOp::Forward, 0, 0, 10, 12}, {PipeOp::Backward, 0, 0, 14, 16}},
                         {{PipeOp::Forward, 0, 0, 12, 13}, {PipeOp::Backward, 0, 0, 13, 14}}};
  EXPECT_DOUBLE_EQ(measured_bubble(ranks), 1.25);
  // Busy back to back on every rank: no bubble.
  EXPECT_DOUBLE_EQ(measured_bubble({{{PipeOp::Forward, 0, 0, 0, 1}}, {{PipeOp::Forward, 0, 0, 0, 1}}}), 0.0);
  expect_contains(error_message([] { measured_bubble({{}, {}}); }), {"no actions were timed"});
  expect_contains(error_message([] { measured_bubble({{{PipeOp::Forward, 0, 0, 0, 1}}, {}}); }), {"no busy time"});
}

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// The tiny run has 2 layers and grad_accum = 2; each error names its key and what would work.
TEST(PipelineConfig, BadPipelineSettingsAreRejectedWithWhatWorks) {
  TinyRun run("pp_config");
  const std::string gpt2 = run.config("gpt2", 4);
  auto error_of = [&](const std::vector<std::string>& overrides) {
    return error_message([&] { (void)parse(gpt2, overrides); });
  };
  expect_contains(error_of({"parallel.pp=3"}),
                  {"'parallel.pp' has value 3", "model.n_layer = 2", "leaves a stage without a layer",
                   "use pp x v <= 2"});
  expect_contains(error_of({"parallel.pp=0"}), {"'parallel.pp' has value 0", "expected >= 1"});
  expect_contains(error_of({"parallel.pp=2", "train.grad_accum=1"}),
                  {"'train.grad_accum' has value 1", "1f1b", "set grad_accum >= 2", "afab"});
  expect_contains(error_of({"parallel.pp=2", "parallel.pp_schedule=\"interleaved\""}),
                  {"'parallel.pp_schedule' (layout schedule) has value interleaved", "v=1", "set v >= 2 or use 1f1b"});
  expect_contains(error_of({"parallel.pp=2", "parallel.pp_chunks=2"}),
                  {"'parallel.pp_chunks' (layout v) has value 2", "1f1b", "only interleaved"});
  expect_contains(error_of({"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=\"interleaved\"",
                            "parallel.pp_chunks=2", "train.grad_accum=3"}),
                  {"'train.grad_accum' has value 3", "groups of parallel.pp = 2", "use a multiple of 2"});
  expect_contains(error_of({"parallel.pp=2", "parallel.zero_stage=2"}),
                  {"'parallel.zero_stage' (layout zero) has value 2", "pp=2", "use zero_stage 0 or 1"});
  expect_contains(error_of({"parallel.pp=2", "parallel.pp_layers=[1, 2]"}),
                  {"'parallel.pp_layers'", "adds up to 3", "model.n_layer = 2"});
  expect_contains(error_of({"parallel.pp=2", "parallel.pp_layers=[2]"}),
                  {"'parallel.pp_layers'", "lists 1 stages, expected 2"});
  expect_contains(error_of({"parallel.pp=2", "parallel.pp_layers=[0, 2]"}),
                  {"'parallel.pp_layers'", "stage 0 0 layers"});
  expect_contains(error_of({"parallel.pp_schedule=\"gpipe\""}),
                  {"'parallel.pp_schedule' has value 'gpipe'", "expected afab, 1f1b, interleaved, zbh1, zbv or dualpipev"});
  // ZB-V: exactly two chunks per rank, and 2 x pp micro-batches.
  expect_contains(error_of({"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=\"zbv\"", "train.grad_accum=4"}),
                  {"'parallel.pp_chunks' (layout v) has value 1", "zbv", "set v=2"});
  expect_contains(error_of({"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=\"zbv\"",
                            "parallel.pp_chunks=2", "train.grad_accum=3"}),
                  {"'train.grad_accum' has value 3", "zbv", "grad_accum >= 2 x pp = 4", "zbh1"});
  expect_contains(error_of({"model.n_layer=3", "parallel.pp=2", "parallel.pp_schedule=\"zbv\"",
                            "parallel.pp_chunks=2", "train.grad_accum=4"}),
                  {"pp x v = 4 stages", "model.n_layer = 3"});
  // GPipe needs no minimum of micro-batches: one is a valid (if bubbly) step.
  EXPECT_EQ(parse(gpt2, {"parallel.pp=2", "train.grad_accum=1", "parallel.pp_schedule=\"afab\""}).pp, 2);
}

TEST(PipelineConfig, ValidPipelineParsesAndNeedsALauncher) {
  TinyRun run("pp_config_ok");
  const std::string gpt2 = run.config("gpt2", 4);
  const TrainConfig defaults = parse(gpt2, {});
  EXPECT_EQ(defaults.pp, 1);
  EXPECT_EQ(defaults.pp_chunks, 1);
  const TrainConfig ok = parse(gpt2, {"parallel.pp=2"});
  EXPECT_EQ(ok.pp, 2);
  EXPECT_EQ(ok.pp_schedule, PipelineSchedule::OneFOneB);  // the default schedule
  EXPECT_EQ(ok.pp_chunks, 1);
  EXPECT_TRUE(ok.pp_layers.empty());  // even split
  const TrainConfig interleaved = parse(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.pp_chunks=2",
                                               "parallel.pp_schedule=\"interleaved\"", "train.grad_accum=4",
                                               "parallel.pp_layers=[1, 1, 1, 1]"});
  EXPECT_EQ(interleaved.pp_schedule, PipelineSchedule::Interleaved);
  EXPECT_EQ(interleaved.pp_chunks, 2);
  EXPECT_EQ(interleaved.pp_layers, (std::vector<int64_t>{1, 1, 1, 1}));
  const TrainConfig zbv = parse(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.pp_chunks=2",
                                       "parallel.pp_schedule=\"zbv\"", "train.grad_accum=4"});
  EXPECT_EQ(zbv.pp_schedule, PipelineSchedule::ZeroBubbleV);
  expect_contains(error_message([&] {
                    parse(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.pp_chunks=2",
                                 "parallel.pp_schedule=\"dualpipev\"", "train.grad_accum=2"});
                  }),
                  {"'train.grad_accum' has value 2", "dualpipev", "grad_accum >= 2 x pp = 4"});
  // DualPipeV's pairs overlapped: auto (on a GPU), on, off; anything else, or on without
  // DualPipeV's pairs, is refused by name.
  const std::vector<std::string> dualpipev = {
      "model.n_layer=4", "parallel.pp=2", "parallel.pp_chunks=2",
      "parallel.pp_schedule=\"dualpipev\"", "train.grad_accum=4"};
  EXPECT_EQ(parse(gpt2, dualpipev).pp_overlap, "auto");
  auto with = [&](const std::string& overlap) {
    std::vector<std::string> o = dualpipev;
    o.push_back("parallel.pp_overlap=\"" + overlap + "\"");
    return o;
  };
  EXPECT_EQ(parse(gpt2, with("on")).pp_overlap, "on");
  EXPECT_EQ(parse(gpt2, with("off")).pp_overlap, "off");
  expect_contains(error_message([&] { parse(gpt2, with("yes")); }),
                  {"'parallel.pp_overlap' has value 'yes'", "expected auto, on or off"});
  expect_contains(error_message([&] {
                    parse(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.pp_chunks=2",
                                 "parallel.pp_schedule=\"zbv\"", "train.grad_accum=4",
                                 "parallel.pp_overlap=\"on\""});
                  }),
                  {"'parallel.pp_overlap' has value 'on'", "only DualPipeV", "pp_schedule = 'zbv'",
                   "pp_schedule = \"dualpipev\""});
  expect_contains(error_message([&] { parse(gpt2, {"parallel.pp_overlap=\"on\""}); }),
                  {"'parallel.pp_overlap' has value 'on'", "no pipeline (parallel.pp = 1)"});
  // One process cannot be two pipeline stages: the trainer says how to launch.
  expect_contains(error_message([&] { Trainer trainer(ok); }), {"parallel.pp = 2", "mpirun -np 2"});
}

}  // namespace
}  // namespace loom::test
