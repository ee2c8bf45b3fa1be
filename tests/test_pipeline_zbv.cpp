// The V schedules: ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory") and
// DualPipeV (DeepSeek's DualPipe folded into the V). The V placement of 2p stages over p ranks,
// their per-rank F/B/W lists (hand-derived for p = 2, m = 4), that every list runs each
// (micro-batch, chunk) once in an order the ranks can follow, their simulated makespan against
// the hand formula, their peak activations against 1F1B's, and bad inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/model/stage_placement.hpp"
#include "loom/parallel/pipeline_schedule.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/search.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using Actions = std::vector<std::vector<PipeAction>>;
constexpr auto kV = StagePlacement::V;
constexpr auto kZbv = PipelineSchedule::ZeroBubbleV;

std::string show(const std::vector<PipeAction>& actions) {
  std::string out;
  for (const PipeAction& a : actions)
    out += std::string(op_letter(a.op)) + std::to_string(a.micro_batch) + "c" +
           std::to_string(a.chunk) + " ";
  return out;
}

TEST(StagePlacement, VPutsTheFirstAndLastStageOnRankZero) {
  // p = 4, 8 stages: rank r holds stages r and 7 - r.
  const int64_t expected_chunk1[] = {7, 6, 5, 4};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(stage_of(0, r, 4, kV), r);
    EXPECT_EQ(stage_of(1, r, 4, kV), expected_chunk1[r]);
    EXPECT_EQ(rank_of_stage(r, 4, kV), r);
    EXPECT_EQ(rank_of_stage(expected_chunk1[r], 4, kV), r);
    EXPECT_EQ(stage_of(1, r, 4, StagePlacement::RoundRobin), 4 + r);
  }
  // Layers [0, 8) in 8 one-layer stages: rank 0 holds layers 0 and 7, rank 3 layers 3 and 4.
  const std::vector<int64_t> eight(8, 1);
  const auto rank0 = pipeline_chunks(eight, 4, 0, kV), rank3 = pipeline_chunks(eight, 4, 3, kV);
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_TRUE(rank0[0].first_stage());
  EXPECT_TRUE(rank0[1].last_stage());
  EXPECT_EQ(rank0[1].first_layer, 7);
  EXPECT_EQ(rank3[0].stage, 3);
  EXPECT_EQ(rank3[1].stage, 4);
  EXPECT_EQ(rank3[1].first_layer, 4);
  expect_contains(error_message([&] { pipeline_chunks(std::vector<int64_t>(6, 1), 2, 0, kV); }),
                  {"2 x pp = 4", "not 6"});
}

// Derived by hand from the rules of pipeline_schedule.hpp (PyTorch's ScheduleZBVZeroBubble):
// rank 0 warms up 2(p - 0) - 1 = 3 chunk-0 forwards, no pairs, then p = 2 triples of chunk 1;
// rank 1 warms up 1 forward, 1 pair (F chunk 1, F chunk 0) and 1 triple.
TEST(ZeroBubbleV, ListsForTwoRanksAndFourMicroBatches) {
  const Actions ranks = pipeline_actions(kZbv, 2, 4, 2);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(show(ranks[0]),
            "F0c0 F1c0 F2c0 F0c1 B0c1 W0c1 F1c1 B1c1 W1c1 F3c0 B0c0 W0c0 F2c1 B2c1 W2c1 "
            "B1c0 W1c0 F3c1 B3c1 W3c1 B2c0 W2c0 B3c0 W3c0 ");
  EXPECT_EQ(show(ranks[1]),
            "F0c0 F0c1 F1c0 F1c1 B0c1 W0c1 F2c0 B0c0 W0c0 F2c1 B1c1 W1c1 F3c0 B1c0 W1c0 "
            "F3c1 B2c1 W2c1 B2c0 B3c1 B3c0 W2c0 W3c1 W3c0 ");
}

// Every (micro-batch, chunk) gets one F, one B and one W per rank, F before B before W, the
// cross-rank order completes (the simulator) and the executor's channels match in order.
TEST(ZeroBubbleV, EveryRankRunsEachFBAndWOnceInAnOrderThatCompletes) {
  int checked = 0;
  for (int64_t p = 2; p <= 6; ++p)
    for (int64_t m = 2 * p; m <= 4 * p + 1; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Actions ranks = pipeline_actions(kZbv, p, m, 2);
      for (const auto& actions : ranks) {
        ASSERT_EQ(actions.size(), static_cast<size_t>(6 * m));
        std::vector<int> state(static_cast<size_t>(2 * m), 0);  // 0 none, 1 F, 2 B, 3 W
        for (const PipeAction& a : actions) {
          int& st = state[static_cast<size_t>(a.micro_batch * 2 + a.chunk)];
          const int want = a.op == PipeOp::Forward ? 0 : a.op == PipeOp::BackwardInput ? 1 : 2;
          ASSERT_EQ(st, want) << show(actions);
          st = want + 1;
        }
        for (int st : state) EXPECT_EQ(st, 3);
      }
      EXPECT_EQ(pipeline_transfer_problem(ranks, p, 2, kV), "");
      EXPECT_NO_THROW(plan::simulate_pipeline(ranks, p, 2, plan::PassTimes{1, 1, 1}, 0.1, kV));
      // Forward-only (evaluation) walks the V too.
      EXPECT_EQ(pipeline_transfer_problem(forward_only_actions(p, m, 2), p, 2, kV), "");
      ++checked;
    }
  EXPECT_GT(checked, 40);
}

// The V's messages: down the ranks in chunk 0, up in chunk 1, and at the turn (rank p - 1,
// stages p - 1 and p) from the rank to itself. Hand values for p = 4.
TEST(ZeroBubbleV, TransfersGoDownThenUpTheRanks) {
  using T = PipeTransfer;
  // Rank 1's chunk 0 (stage 1) sends its activation to stage 2 on rank 2.
  EXPECT_EQ(*transfer_out_of({PipeOp::Forward, 5, 0}, 1, 4, 2, kV),
            (T{PipeMessage::Activation, 5, 2, 1, 2}));
  // Rank 1's chunk 1 (stage 6) gets it from stage 5 on rank 2 and sends on to stage 7, rank 0.
  EXPECT_EQ(*transfer_into({PipeOp::Forward, 5, 1}, 1, 4, 2, kV),
            (T{PipeMessage::Activation, 5, 6, 2, 1}));
  EXPECT_EQ(*transfer_out_of({PipeOp::Forward, 5, 1}, 1, 4, 2, kV),
            (T{PipeMessage::Activation, 5, 7, 1, 0}));
  // Its B on chunk 1 sends the gradient down to stage 5 on rank 2, on chunk 0 to stage 0.
  EXPECT_EQ(*transfer_out_of({PipeOp::BackwardInput, 5, 1}, 1, 4, 2, kV),
            (T{PipeMessage::Gradient, 5, 5, 1, 2}));
  EXPECT_EQ(*transfer_out_of({PipeOp::BackwardInput, 5, 0}, 1, 4, 2, kV),
            (T{PipeMessage::Gradient, 5, 0, 1, 0}));
  // The turn: stage 3 -> stage 4 and back, both on rank 3.
  EXPECT_EQ(*transfer_out_of({PipeOp::Forward, 2, 0}, 3, 4, 2, kV),
            (T{PipeMessage::Activation, 2, 4, 3, 3}));
  EXPECT_EQ(*transfer_into({PipeOp::BackwardInput, 2, 0}, 3, 4, 2, kV),
            (T{PipeMessage::Gradient, 2, 3, 3, 3}));
  // Rank 0 holds both ends: nothing into its first stage's F, nothing out of its last stage's F
  // or into its B; W's move nothing.
  EXPECT_FALSE(transfer_into({PipeOp::Forward, 0, 0}, 0, 4, 2, kV).has_value());
  EXPECT_FALSE(transfer_out_of({PipeOp::Forward, 0, 1}, 0, 4, 2, kV).has_value());
  EXPECT_FALSE(transfer_into({PipeOp::BackwardInput, 0, 1}, 0, 4, 2, kV).has_value());
  EXPECT_FALSE(transfer_out_of({PipeOp::BackwardWeight, 0, 1}, 2, 4, 2, kV).has_value());
}

// With F = B = W = 1 per chunk pass: every rank is busy 6m (F, B and W of 2 chunks per
// micro-batch). The last rank cannot start before micro-batch 0 has crossed the p - 1 ranks
// above it (p - 1 forwards, no p2p), so the makespan is at least 6m + p - 1, and ZB-V reaches
// it: each rank idles p - 1 passes in all. By hand for p = 2, m = 4 (the lists above): rank 1
// idles 0-1 while F0c0 runs on rank 0, then runs its 24 passes back to back to 25 (B0c1 at 5-6
// right after rank 0's B0c1 at 4-5, B2c1 at 17-18 after rank 0's at 13-14, ...); rank 0 runs
// back to back from 0 to 24 (F0c1 at 3-4 right after rank 1's F0c1 at 2-3, B0c0 at 10-11 after
// rank 1's B0c0 at 8-9, ...) and idles the last pass.
TEST(ZeroBubbleV, MakespanIsSixMPlusPMinusOnePassesWithEqualPasses) {
  for (int64_t p = 2; p <= 5; ++p)
    for (int64_t m : {2 * p, 2 * p + 1, 3 * p, 4 * p}) {
      const auto t = plan::simulate_pipeline(pipeline_actions(kZbv, p, m, 2), p, 2,
                                             plan::PassTimes{1, 1, 1}, 0, kV);
      EXPECT_DOUBLE_EQ(t.makespan, static_cast<double>(6 * m + p - 1)) << "p=" << p << " m=" << m;
      EXPECT_NEAR(t.bubble_fraction,
                  static_cast<double>(p - 1) / static_cast<double>(6 * m + p - 1), 1e-12);
    }
  // Against interleaved 1F1B (v = 2) and ZB-H1 on the same work (a rank's F, B and W split in two
  // chunks for the V and interleaved): p = 4, m = 8, F = B = W = 1 per chunk.
  const auto zbv = plan::simulate_pipeline(pipeline_actions(kZbv, 4, 8, 2), 4, 2,
                                           plan::PassTimes{1, 1, 1}, 0, kV);
  const auto interleaved = plan::simulate_pipeline(
      pipeline_actions(PipelineSchedule::Interleaved, 4, 8, 2), 4, 2, plan::PassTimes{1, 1, 1}, 0);
  const auto zbh1 = plan::simulate_pipeline(
      pipeline_actions(PipelineSchedule::ZeroBubbleH1, 4, 8, 1), 4, 1, plan::PassTimes{2, 2, 2}, 0);
  // Interleaved: (m v + p - 1)(F + B + W) = (16 + 3) x 3 = 57 (Narayanan et al. 2021 sec 2.2.2);
  // ZB-H1: m (F + B + W) + (p - 1)(F + B - W) = 8 x 6 + 3 x 2 = 54 (Qi et al. 2023 sec 3.1).
  EXPECT_DOUBLE_EQ(interleaved.makespan, 57.0);
  EXPECT_DOUBLE_EQ(zbh1.makespan, 54.0);
  EXPECT_DOUBLE_EQ(zbv.makespan, 51.0);
}

// Activations: every rank keeps at most 2p chunk passes between F and W, half its layers each,
// so p micro-batches of its layers: 1F1B's peak on rank 0 (p whole stages).
TEST(ZeroBubbleV, PeakActivationsEqualOneFOneBsFirstRank) {
  for (int64_t p = 2; p <= 5; ++p) {
    const int64_t m = 3 * p;
    const Actions zbv = pipeline_actions(kZbv, p, m, 2);
    const auto t = plan::simulate_pipeline(zbv, p, 2, plan::PassTimes{1, 1, 1}, 0, kV);
    const Actions onefoneb = pipeline_actions(PipelineSchedule::OneFOneB, p, m, 1);
    const int64_t stage_set = 1000, half = stage_set / 2;
    const int64_t onefoneb_peak = plan::peak_activation_bytes(onefoneb[0], stage_set, 0);
    EXPECT_EQ(onefoneb_peak, p * stage_set);
    for (int64_t r = 0; r < p; ++r) {
      EXPECT_EQ(t.peak_in_flight[static_cast<size_t>(r)], 2 * p) << "p=" << p << " rank " << r;
      // Sets are freed at B (what the executor's pool does); W's copies cost nothing here.
      EXPECT_LE(plan::peak_activation_bytes(zbv[static_cast<size_t>(r)], half, 0), onefoneb_peak);
    }
    EXPECT_EQ(plan::peak_activation_bytes(zbv[0], half, 0), onefoneb_peak);
  }
}

TEST(ZeroBubbleV, BadInputsSayWhatWouldWork) {
  expect_contains(error_message([] { pipeline_actions(kZbv, 2, 4, 1); }),
                  {"zbv", "v (chunks per rank) = 1", "expected 2"});
  expect_contains(error_message([] { pipeline_actions(kZbv, 2, 3, 2); }),
                  {"zbv", "m (micro-batches) = 3", "m >= 2p = 4", "zbh1"});
  expect_contains(error_message([] { pipeline_actions(kZbv, 4, 7, 2); }), {"m >= 2p = 8"});
  EXPECT_EQ(stage_placement(kZbv), kV);
  EXPECT_EQ(stage_placement(PipelineSchedule::Interleaved), StagePlacement::RoundRobin);
  EXPECT_TRUE(splits_backward(kZbv));
}

// F, B (whole backward), I (input-gradient B of a split backward), W.
std::string show_split(const std::vector<PipeAction>& actions) {
  std::string out;
  for (const PipeAction& a : actions) {
    const char* letter = a.op == PipeOp::Forward         ? "F"
                         : a.op == PipeOp::Backward      ? "B"
                         : a.op == PipeOp::BackwardInput ? "I"
                                                         : "W";
    out +=
        std::string(letter) + std::to_string(a.micro_batch) + "c" + std::to_string(a.chunk) + " ";
  }
  return out;
}

// Derived by hand from DeepSeek's dualpipev.py steps for p = 2, m = 4. Rank 0: 2 F0, 1 pair
// (F0, F1), 1 (B1 split, W, F1), 1 round of F0 B1 F1 B0, 1 of B1 F1 B0, then B1 whole and B0
// split, 1 (W, B0 split), the last W. Rank 1: 2 pairs, 2 rounds, then (B1, B0) whole and
// (B1, B0) split, the 2 W's.
TEST(DualPipeV, ListsForTwoRanksAndFourMicroBatches) {
  const Actions ranks = pipeline_actions(PipelineSchedule::DualPipeV, 2, 4, 2);
  EXPECT_EQ(show_split(ranks[0]),
            "F0c0 F1c0 F2c0 F0c1 I0c1 W0c1 F1c1 F3c0 B1c1 F2c1 B0c0 B2c1 F3c1 B1c0 B3c1 I2c0 W2c0 "
            "I3c0 W3c0 ");
  EXPECT_EQ(
      show_split(ranks[1]),
      "F0c0 F0c1 F1c0 F1c1 F2c0 B0c1 F2c1 B0c0 F3c0 B1c1 F3c1 B1c0 B2c1 B2c0 I3c1 I3c0 W3c1 W3c0 ");
  EXPECT_EQ(stage_placement(PipelineSchedule::DualPipeV), kV);
  expect_contains(error_message([] { pipeline_actions(PipelineSchedule::DualPipeV, 3, 5, 2); }),
                  {"dualpipev", "m >= 2p = 6"});
}

// The pairs an overlapping executor runs together (dualpipev.py's _forward_backward_chunk):
// for p = 2, m = 4 (the lists above) rank 0's are F3c0 B1c1, F2c1 B0c0 and F3c1 B1c0 (positions
// 7, 9, 12), rank 1's F2c0 B0c1, F2c1 B0c0, F3c0 B1c1 and F3c1 B1c0 (4, 6, 8, 10). In general
// rank r has two a round of its steady state (m - 2p + r + 1 rounds) and one in each of the
// p - r - 1 rounds after it, and the lists stay deadlock-free when each pair receives both
// inputs before it sends either output.
TEST(DualPipeV, OverlappedPairsAreItsSteadyStatesForwardBackwardSteps) {
  const Actions two = pipeline_actions(PipelineSchedule::DualPipeV, 2, 4, 2);
  auto starts = [](const std::vector<PipeAction>& list) {
    std::vector<size_t> at;
    for (size_t i = 0; i < list.size(); ++i)
      if (starts_forward_backward_pair(list, i)) at.push_back(i++);
    return at;
  };
  EXPECT_EQ(starts(two[0]), (std::vector<size_t>{7, 9, 12}));
  EXPECT_EQ(starts(two[1]), (std::vector<size_t>{4, 6, 8, 10}));
  EXPECT_EQ(pipeline_transfer_problem(two, 2, 2, kV, /*overlapped_pairs=*/true), "");
  for (int64_t p = 2; p <= 6; ++p)
    for (int64_t m = 2 * p; m <= 4 * p + 1; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Actions ranks = pipeline_actions(PipelineSchedule::DualPipeV, p, m, 2);
      for (int64_t r = 0; r < p; ++r)
        EXPECT_EQ(static_cast<int64_t>(starts(ranks[static_cast<size_t>(r)]).size()),
                  2 * (m - 2 * p + r + 1) + (p - r - 1))
            << "rank " << r;
      EXPECT_EQ(pipeline_transfer_problem(ranks, p, 2, kV, true), "");
    }
  // ZB-V has none: its backwards are all split.
  for (const auto& list : pipeline_actions(PipelineSchedule::ZeroBubbleV, 2, 4, 2))
    EXPECT_TRUE(starts(list).empty());
}

// The planner's DualPipeV with its pairs overlapped (p = 2, m = 4: rank 0 runs 3 pairs, rank 1
// 4). Forward F = 1, whole backward B = 2 (input gradient 1, weights 1). With nothing hidable a
// pair lasts F + B = 3, and each rank is busy 2m(F + B) = 24. With the forward all
// communication (hidable 1), a pair lasts max(0 + 2, 1, 2) = 2: one F less per pair, rank 0
// busy 21 and rank 1 20.
TEST(DualPipeV, OverlappedPairsInTheSimulationHideOnePassesCommunicationUnderTheOther) {
  const Actions lists = pipeline_actions(PipelineSchedule::DualPipeV, 2, 4, 2);
  auto busy_and_pairs = [&](double hidable_forward) {
    const std::vector<plan::PassTimes> stages(4, plan::PassTimes{1, 1, 1, hidable_forward, 0});
    const auto t = plan::simulate_pipeline(lists, 2, 2, stages, 0, kV, /*overlapped_pairs=*/true);
    std::vector<double> busy(2, 0.0);
    std::vector<std::vector<double>> pair_lengths(2);
    for (size_t i = 0; i < t.spans.size(); ++i) {
      const auto& sp = t.spans[i];
      const bool paired = i + 1 < t.spans.size() && t.spans[i + 1].rank == sp.rank &&
                          t.spans[i + 1].start == sp.start && t.spans[i + 1].end == sp.end &&
                          sp.op == PipeOp::Forward && t.spans[i + 1].op == PipeOp::Backward;
      busy[static_cast<size_t>(sp.rank)] += sp.end - sp.start;
      if (paired) {
        pair_lengths[static_cast<size_t>(sp.rank)].push_back(sp.end - sp.start);
        ++i;  // the pair's backward shares its span
      }
    }
    return std::make_pair(busy, pair_lengths);
  };
  const auto [busy0, pairs0] = busy_and_pairs(0);
  EXPECT_EQ(busy0, (std::vector<double>{24, 24}));
  EXPECT_EQ(pairs0[0], (std::vector<double>{3, 3, 3}));
  EXPECT_EQ(pairs0[1], (std::vector<double>{3, 3, 3, 3}));
  const auto [busy1, pairs1] = busy_and_pairs(1);
  EXPECT_EQ(busy1, (std::vector<double>{21, 20}));
  EXPECT_EQ(pairs1[0], (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(pairs1[1], (std::vector<double>{2, 2, 2, 2}));
  // In sequence (no pairs) nothing is hidden.
  const auto seq = plan::simulate_pipeline(
      lists, 2, 2, std::vector<plan::PassTimes>(4, plan::PassTimes{1, 1, 1, 1, 0}), 0, kV);
  EXPECT_DOUBLE_EQ(seq.makespan, 6 * 4 + 2 - 1);
  expect_contains(error_message([&] {
                    plan::simulate_pipeline(
                        lists, 2, 2,
                        std::vector<plan::PassTimes>(4, plan::PassTimes{1, 1, 1, 2, 0}), 0, kV,
                        true);
                  }),
                  {"hidable forward 2", "expected each within its pass"});
}

// Each (micro-batch, chunk) once: one F, then one whole backward or one B and one W; the lists
// complete across ranks and match on every channel; F = B = W gives ZB-V's 6m + p - 1 (the same
// lower bound: only the last rank's wait for the first activation), and the steady state's pairs
// keep 2p + 1 chunk passes in flight per rank (one F ahead of each whole backward).
TEST(DualPipeV, EveryListCompletesWithZbvMakespanAndOneMorePassInFlight) {
  int checked = 0;
  for (int64_t p = 2; p <= 6; ++p)
    for (int64_t m = 2 * p; m <= 4 * p + 1; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Actions ranks = pipeline_actions(PipelineSchedule::DualPipeV, p, m, 2);
      for (const auto& actions : ranks) {
        std::vector<int> state(static_cast<size_t>(2 * m), 0);  // 0 none, 1 F, 2 B (split), 3 done
        for (const PipeAction& a : actions) {
          int& st = state[static_cast<size_t>(a.micro_batch * 2 + a.chunk)];
          const int want = a.op == PipeOp::Forward ? 0 : a.op == PipeOp::BackwardWeight ? 2 : 1;
          ASSERT_EQ(st, want) << show_split(actions);
          st = a.op == PipeOp::Backward ? 3 : want + 1;
        }
        for (int st : state) EXPECT_EQ(st, 3);
      }
      EXPECT_EQ(pipeline_transfer_problem(ranks, p, 2, kV), "");
      const auto t = plan::simulate_pipeline(ranks, p, 2, plan::PassTimes{1, 1, 1}, 0, kV);
      EXPECT_DOUBLE_EQ(t.makespan, static_cast<double>(6 * m + p - 1));
      for (int64_t r = 0; r < p; ++r)
        EXPECT_EQ(t.peak_in_flight[static_cast<size_t>(r)], 2 * p + 1) << "rank " << r;
      ++checked;
    }
  EXPECT_GT(checked, 40);
}

// The planner: its time model simulates the zbv lists (bubble below interleaved's and ZB-H1's on
// the same layout), and its search ranks zbv layouts where the layers cut into 2p stages.
TEST(ZeroBubbleV, PlannerPredictsAndSearchesIt) {
  const ModelConfig m = model_preset("llama-8b");  // 32 layers: 2p = 8 stages of 4 at pp = 4
  plan::ClusterSpec cluster;
  cluster.gpus_per_node = 8;
  cluster.nodes = 1;
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = 4096;
  job.global_batch = 16;  // m = 8 micro-batches per dp rank at dp = 2: 2p
  job.memory.micro_batches = 1;
  auto bubble = [&](const std::string& layout) {
    const plan::StepTime t = plan::predict_step_time(m, plan::parse_layout(layout), cluster, job);
    return t.bubble_s / (t.compute_s + t.tp_comm_s);
  };
  const double zbv = bubble("pp=4,dp=2,mbs=1,v=2,schedule=zbv");
  EXPECT_LT(zbv, bubble("pp=4,dp=2,mbs=1,v=2,schedule=interleaved"));
  EXPECT_LT(zbv, bubble("pp=4,dp=2,mbs=1,schedule=zbh1"));
  EXPECT_GT(zbv, 0);
  const plan::SearchResult r = plan::search_layouts(m, cluster, job);
  bool found = false;
  for (const auto& c : r.ranked) {
    if (stage_placement(c.layout.schedule) != kV) continue;
    found = true;
    EXPECT_EQ(c.layout.vp, 2);
    EXPECT_EQ(m.n_layer % (2 * c.layout.pp), 0);
    EXPECT_GE(c.time.micro_batches, 2 * c.layout.pp);
  }
  EXPECT_TRUE(found);
  EXPECT_LT(bubble("pp=4,dp=2,mbs=1,v=2,schedule=dualpipev"),
            bubble("pp=4,dp=2,mbs=1,v=2,schedule=interleaved"));
}

}  // namespace
}  // namespace loom::test
