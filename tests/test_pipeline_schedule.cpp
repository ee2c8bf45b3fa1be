// Pipeline schedules and their simulated timeline: every list runs each forward and backward
// once, 1F1B warms up by p - r - 1, the bubble matches Narayanan et al. 2021 (sec 2.2) exactly
// when p2p is free, activations in flight match GPipe's m and 1F1B's p, interleaved follows
// Megatron-LM's order, and bad inputs and deadlocked lists are refused with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/parallel/pipeline_schedule.hpp"
#include "loom/plan/pipeline_sim.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using plan::PipelineTimeline;
using plan::simulate_pipeline;
using Schedule = PipelineSchedule;
using Actions = std::vector<std::vector<PipeAction>>;

// Per-micro-batch compute of a whole rank's layers; backward costs twice the forward.
constexpr double kForward = 1.0;
constexpr double kBackward = 2.0;

// Bubble of a timeline relative to useful compute (the paper's t_pb / t_id), from the bubble as
// a share of the makespan that simulate_pipeline reports: idle / busy = f / (1 - f).
double bubble_over_ideal(const PipelineTimeline& t) {
  return t.bubble_fraction / (1.0 - t.bubble_fraction);
}

PipelineTimeline simulate(Schedule s, int64_t p, int64_t m, int64_t v, double p2p_s = 0) {
  // Per-chunk times are the rank's times split over its v chunks, so interleaving changes the
  // order, not the work.
  return simulate_pipeline(pipeline_actions(s, p, m, v), p, v, kForward / v, kBackward / v, p2p_s);
}

std::string show(const PipeAction& a) {
  return std::string(op_letter(a.op)) + std::to_string(a.micro_batch) + "c" +
         std::to_string(a.chunk);
}

TEST(PipelineSchedule, EveryRankRunsEachForwardAndBackwardOnceForwardFirst) {
  struct Case {
    Schedule s;
    int64_t p, m, v;
  };
  for (const Case& c :
       {Case{Schedule::AllForwardAllBackward, 4, 6, 1}, Case{Schedule::OneFOneB, 4, 6, 1},
        Case{Schedule::OneFOneB, 4, 2, 1}, Case{Schedule::Interleaved, 4, 8, 3},
        Case{Schedule::Interleaved, 2, 2, 2}}) {
    SCOPED_TRACE(std::string(schedule_name(c.s)) + " p=" + std::to_string(c.p) +
                 " m=" + std::to_string(c.m));
    const Actions ranks = pipeline_actions(c.s, c.p, c.m, c.v);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(c.p));
    for (const auto& actions : ranks) {
      ASSERT_EQ(actions.size(), static_cast<size_t>(2 * c.m * c.v));
      // 0: not seen, 1: forwarded, 2: backwarded; a backward before its forward fails.
      std::vector<int> state(static_cast<size_t>(c.m * c.v), 0);
      for (const PipeAction& a : actions) {
        ASSERT_TRUE(a.micro_batch >= 0 && a.micro_batch < c.m && a.chunk >= 0 && a.chunk < c.v)
            << show(a);
        int& st = state[static_cast<size_t>(a.micro_batch * c.v + a.chunk)];
        EXPECT_EQ(st, a.op == PipeOp::Forward ? 0 : 1) << show(a);
        st = a.op == PipeOp::Forward ? 1 : 2;
      }
      for (int st : state) EXPECT_EQ(st, 2);
    }
  }
}

TEST(PipelineSchedule, OneFOneBWarmsUpByLaterRanksThenAlternates) {
  const int64_t p = 4, m = 6;
  const Actions ranks = pipeline_actions(Schedule::OneFOneB, p, m, 1);
  for (int64_t r = 0; r < p; ++r) {
    const auto& a = ranks[static_cast<size_t>(r)];
    const int64_t warmup = p - r - 1;
    // warm-up forwards, then F/B pairs, then warm-up many backwards
    std::string expected, got;
    for (int64_t i = 0; i < warmup; ++i) expected += "F";
    for (int64_t i = 0; i < m - warmup; ++i) expected += "FB";
    for (int64_t i = 0; i < warmup; ++i) expected += "B";
    for (const PipeAction& x : a) got += x.op == PipeOp::Forward ? "F" : "B";
    EXPECT_EQ(got, expected) << "rank " << r;
    // Micro-batches go through in order in both directions.
    int64_t next_f = 0, next_b = 0;
    for (const PipeAction& x : a)
      EXPECT_EQ(x.micro_batch, x.op == PipeOp::Forward ? next_f++ : next_b++);
  }
  // Fewer micro-batches than warm-up slots: rank 0 can only forward all m, then backward them.
  const auto short_rank0 = pipeline_actions(Schedule::OneFOneB, 4, 2, 1)[0];
  std::string got;
  for (const PipeAction& x : short_rank0) got += x.op == PipeOp::Forward ? "F" : "B";
  EXPECT_EQ(got, "FFBB");
}

TEST(PipelineSchedule, InterleavedFollowsMegatronOrder) {
  // p = 2, m = 4, v = 2, derived by hand from Megatron-LM's get_model_chunk_id: forwards in
  // groups of p per chunk, backwards from the last chunk; rank 1 warms up (v - 1) * p = 2.
  const Actions ranks = pipeline_actions(Schedule::Interleaved, 2, 4, 2);
  std::string rank1, rank0;
  for (const PipeAction& a : ranks[1]) rank1 += show(a) + " ";
  for (const PipeAction& a : ranks[0]) rank0 += show(a) + " ";
  EXPECT_EQ(rank1,
            "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0 ");
  // rank 0 warms up 2 + 2 = 4, leaving 4 pairs
  EXPECT_EQ(rank0,
            "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0 ");
}

TEST(PipelineSim, AfabAnd1F1BMakespanIsMPlusPMinusOneSteps) {
  for (Schedule s : {Schedule::AllForwardAllBackward, Schedule::OneFOneB})
    for (int64_t p : {2, 4, 8})
      for (int64_t m : {1, 3, 8, 32}) {
        SCOPED_TRACE(std::string(schedule_name(s)) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        const PipelineTimeline t = simulate(s, p, m, 1);
        EXPECT_DOUBLE_EQ(t.makespan, static_cast<double>(m + p - 1) * (kForward + kBackward));
        // Reported convention: idle share of the makespan, (p-1)/(m+p-1) ...
        EXPECT_NEAR(t.bubble_fraction, (p - 1.0) / static_cast<double>(m + p - 1), 1e-12);
        // ... which is the paper's (p-1)/m relative to the ideal (busy) time.
        EXPECT_NEAR(bubble_over_ideal(t), (p - 1.0) / static_cast<double>(m), 1e-12);
        EXPECT_EQ(t.spans.size(), static_cast<size_t>(2 * p * m));
      }
  // One data point spelled out: p = 4, m = 8 -> 11 steps of 3 s, bubble 3/11 of the makespan.
  const PipelineTimeline t = simulate(Schedule::OneFOneB, 4, 8, 1);
  EXPECT_DOUBLE_EQ(t.makespan, 33.0);
  EXPECT_NEAR(t.bubble_fraction, 3.0 / 11.0, 1e-12);
  EXPECT_NEAR(bubble_over_ideal(t), 3.0 / 8.0, 1e-12);
}

TEST(PipelineSim, InterleavedCutsTheBubbleByV) {
  for (int64_t p : {2, 4, 8})
    for (int64_t groups : {1, 2, 4})
      for (int64_t v : {2, 3, 4}) {
        const int64_t m = groups * p;
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) +
                     " v=" + std::to_string(v));
        const PipelineTimeline t = simulate(Schedule::Interleaved, p, m, v);
        const double ideal = static_cast<double>(m) * (kForward + kBackward);
        EXPECT_NEAR(t.makespan, ideal + (p - 1.0) * (kForward + kBackward) / v, 1e-9);
        EXPECT_NEAR(bubble_over_ideal(t), (p - 1.0) / static_cast<double>(v * m), 1e-9);
        // and strictly below 1F1B on the same work
        EXPECT_LT(t.bubble_fraction, simulate(Schedule::OneFOneB, p, m, 1).bubble_fraction);
      }
}

TEST(PipelineSim, PeakInFlightIsMForGpipePFor1F1BAndOneOnTheLastRank) {
  const int64_t p = 4, m = 8;
  const PipelineTimeline afab = simulate(Schedule::AllForwardAllBackward, p, m, 1);
  const PipelineTimeline ofob = simulate(Schedule::OneFOneB, p, m, 1);
  EXPECT_EQ(afab.peak_in_flight, (std::vector<int64_t>{m, m, m, m}));
  EXPECT_EQ(ofob.peak_in_flight, (std::vector<int64_t>{4, 3, 2, 1}));  // p - r
  // Interleaved holds more (Narayanan et al. sec 2.2.2): warm-up + 1 chunk-micro-batches.
  const PipelineTimeline inter = simulate(Schedule::Interleaved, p, m, 2);
  EXPECT_EQ(inter.peak_in_flight, (std::vector<int64_t>{11, 9, 7, 5}));
}

TEST(PipelineSim, SingleRankHasNoBubbleAndP2pCostsTime) {
  for (Schedule s : {Schedule::AllForwardAllBackward, Schedule::OneFOneB}) {
    const PipelineTimeline t = simulate(s, 1, 5, 1, /*p2p_s=*/0.5);  // no neighbour to send to
    EXPECT_DOUBLE_EQ(t.makespan, 5 * (kForward + kBackward));
    EXPECT_DOUBLE_EQ(t.bubble_fraction, 0.0);
  }
  // One rank with two chunks: stage 0 hands to stage 1 in the same memory, so no p2p either.
  const PipelineTimeline local = simulate(Schedule::Interleaved, 1, 3, 2, 0.5);
  EXPECT_DOUBLE_EQ(local.makespan, 3 * (kForward + kBackward));
  EXPECT_DOUBLE_EQ(local.bubble_fraction, 0.0);
  // GPipe streams, so p2p is exposed only on the fill of each phase: the last forward crosses
  // p - 1 links, the last backward p - 1 more: 33 s + 6 x 0.25 s.
  const double hop = 0.25;
  const PipelineTimeline afab = simulate(Schedule::AllForwardAllBackward, 4, 8, 1, hop);
  EXPECT_DOUBLE_EQ(afab.makespan, 33.0 + 6 * hop);
  // 1F1B, p = 2, m = 2, by hand: rank 0 F0 [0,1] F1 [1,2]; rank 1 F0 [1.25,2.25] B0 [2.25,4.25]
  // F1 [4.25,5.25] B1 [5.25,7.25]; rank 0 B0 [4.5,6.5] B1 [7.5,9.5].
  EXPECT_DOUBLE_EQ(simulate(Schedule::OneFOneB, 2, 2, 1, hop).makespan, 9.5);
  // With many micro-batches 1F1B pays more: rank 0 holds only p in flight, so in steady state
  // it waits for each micro-batch's round trip, latency included, before the next forward.
  const PipelineTimeline ofob = simulate(Schedule::OneFOneB, 4, 8, 1, hop);
  EXPECT_GT(ofob.makespan, afab.makespan);
}

TEST(PipelineSim, SpansNeverOverlapOnARankAndEndAtTheMakespan) {
  const int64_t p = 4, v = 2;
  const PipelineTimeline t = simulate(Schedule::Interleaved, p, 8, v, 0.1);
  std::vector<double> last_end(p, 0.0);
  for (const auto& span : t.spans) {
    EXPECT_GE(span.start, last_end[static_cast<size_t>(span.rank)] - 1e-12);
    last_end[static_cast<size_t>(span.rank)] = span.end;
  }
  // The first forward starts at 0 and the last backward defines the makespan.
  EXPECT_DOUBLE_EQ(t.spans.front().start, 0.0);
  double last = 0;
  for (const auto& span : t.spans) last = std::max(last, span.end);
  EXPECT_DOUBLE_EQ(t.makespan, last);
}

// ZB-H1 (Qi et al. 2023, sec 3.1): per rank every micro-batch's F, then its B, then its W; the
// forwards and B's in 1F1B's order; rank r's W's trail its B's by r.
TEST(PipelineSchedule, ZeroBubbleH1Is1F1BWithWeightGradientsHeldBackByRank) {
  for (int64_t p : {2, 3, 4})
    for (int64_t m : {p, p + 1, 2 * p + 1}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Actions zb = pipeline_actions(Schedule::ZeroBubbleH1, p, m, 1);
      const Actions one = pipeline_actions(Schedule::OneFOneB, p, m, 1);
      for (int64_t r = 0; r < p; ++r) {
        std::vector<PipeAction> fb, w;
        int64_t b_done = 0, max_lag = 0;
        for (const PipeAction& a : zb[static_cast<size_t>(r)]) {
          if (a.op == PipeOp::BackwardWeight) {
            ASSERT_LT(a.micro_batch, b_done) << "a W before its B";
            EXPECT_EQ(a.micro_batch, static_cast<int64_t>(w.size())) << "W's in micro-batch order";
            max_lag = std::max(max_lag, b_done - a.micro_batch - 1);
            w.push_back(a);
            continue;
          }
          ASSERT_NE(a.op, PipeOp::Backward) << "ZB-H1 splits every backward";
          if (a.op == PipeOp::BackwardInput) ++b_done;
          fb.push_back({a.op == PipeOp::BackwardInput ? PipeOp::Backward : a.op, a.micro_batch, a.chunk});
        }
        ASSERT_EQ(static_cast<int64_t>(w.size()), m);
        ASSERT_EQ(fb.size(), one[static_cast<size_t>(r)].size());
        for (size_t i = 0; i < fb.size(); ++i)
          EXPECT_EQ(show(fb[i]), show(one[static_cast<size_t>(r)][i])) << "rank " << r << " action " << i;
        EXPECT_EQ(max_lag, std::min(r, m - 1)) << "rank " << r;
      }
    }
}

// With F, B and W equally long and p2p free, ZB-H1's makespan is m (F + B + W) + (p - 1)(F + B - W)
// against 1F1B's (m + p - 1)(F + B + W) (Qi et al. 2023, sec 3.1 and Table 1): the bubble cut to a
// third. Every rank keeps p micro-batches between F and W, 1F1B's peak on rank 0.
TEST(PipelineSim, ZeroBubbleH1CutsThe1F1BBubbleToAThird) {
  const plan::PassTimes unit{1, 1, 1};
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {p, 2 * p, 3 * p + 1}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto zb = simulate_pipeline(pipeline_actions(Schedule::ZeroBubbleH1, p, m, 1), p, 1, unit, 0);
      const auto one = simulate_pipeline(pipeline_actions(Schedule::OneFOneB, p, m, 1), p, 1, unit, 0);
      EXPECT_DOUBLE_EQ(one.makespan, static_cast<double>(3 * (m + p - 1)));
      EXPECT_DOUBLE_EQ(zb.makespan, static_cast<double>(3 * m + (p - 1)));
      EXPECT_NEAR(bubble_over_ideal(zb), (p - 1) / (3.0 * m), 1e-12);
      EXPECT_NEAR(bubble_over_ideal(one), (p - 1) / static_cast<double>(m), 1e-12);
      for (int64_t r = 0; r < p; ++r) EXPECT_EQ(zb.peak_in_flight[static_cast<size_t>(r)], p) << "rank " << r;
      // The activation sets (F to B) are 1F1B's; the W's copies add r + 1 micro-batches' worth.
      const Actions lists = pipeline_actions(Schedule::ZeroBubbleH1, p, m, 1);
      for (int64_t r = 0; r < p; ++r) {
        EXPECT_EQ(plan::peak_activation_bytes(lists[static_cast<size_t>(r)], 1, 0), p - r);
        EXPECT_EQ(plan::peak_activation_bytes(lists[static_cast<size_t>(r)], 0, 1), r + 1);
      }
    }
  // A W waits for its own B only; a list with a W before its B is refused.
  Actions early = pipeline_actions(Schedule::ZeroBubbleH1, 2, 2, 1);
  std::swap(early[0][2], early[0][3]);  // rank 0: F0 F1 B0 W0 ... -> F0 F1 W0 B0
  expect_contains(error_message([&] { simulate_pipeline(early, 2, 1, unit, 0); }), {"rank 0", "W of micro-batch 0", "before its B"});
}

TEST(PipelineSchedule, BadInputsSayWhy) {
  expect_contains(error_message([] { pipeline_actions(Schedule::OneFOneB, 0, 4, 1); }),
                  {"p (pipeline ranks) = 0"});
  expect_contains(error_message([] { pipeline_actions(Schedule::OneFOneB, 4, 0, 1); }),
                  {"m (micro-batches) = 0"});
  expect_contains(error_message([] { pipeline_actions(Schedule::AllForwardAllBackward, 4, 4, 2); }),
                  {"afab", "v (chunks per rank) = 2", "expected 1"});
  expect_contains(error_message([] { pipeline_actions(Schedule::Interleaved, 4, 6, 2); }),
                  {"m (micro-batches) = 6", "not a multiple of p", "= 4"});
  expect_contains(error_message([] { pipeline_actions(Schedule::Interleaved, 4, 8, 1); }),
                  {"v (chunks per rank) = 1", ">= 2"});
  expect_contains(error_message([] { pipeline_actions(Schedule::ZeroBubbleH1, 4, 8, 2); }),
                  {"zbh1", "v (chunks per rank) = 2", "expected 1"});
}

TEST(PipelineSim, DeadlockAndIncompleteListsAreRefused) {
  // Rank 0 wants micro-batch 0's backward before it has run that forward.
  const Actions deadlocked = {{{PipeOp::Backward, 0, 0}, {PipeOp::Forward, 0, 0}},
                              {{PipeOp::Forward, 0, 0}, {PipeOp::Backward, 0, 0}}};
  expect_contains(error_message([&] { simulate_pipeline(deadlocked, 2, 1, 1, 2, 0); }),
                  {"deadlock", "rank 0", "backward of micro-batch 0"});
  // Rank 1 runs micro-batch 1 first but rank 0 will only forward it after backwarding
  // micro-batch 0, which needs rank 1: a cycle across ranks.
  const Actions crossed = {{{PipeOp::Forward, 0, 0},
                            {PipeOp::Backward, 0, 0},
                            {PipeOp::Forward, 1, 0},
                            {PipeOp::Backward, 1, 0}},
                           {{PipeOp::Forward, 1, 0},
                            {PipeOp::Forward, 0, 0},
                            {PipeOp::Backward, 0, 0},
                            {PipeOp::Backward, 1, 0}}};
  expect_contains(error_message([&] { simulate_pipeline(crossed, 2, 1, 1, 2, 0); }), {"deadlock"});
  Actions missing = pipeline_actions(Schedule::OneFOneB, 2, 3, 1);
  missing[1].pop_back();
  expect_contains(error_message([&] { simulate_pipeline(missing, 2, 1, 1, 2, 0); }),
                  {"rank 1", "micro-batch 2 chunk 0", "0 backward(s)"});
  expect_contains(error_message([&] { simulate_pipeline(deadlocked, 3, 1, 1, 2, 0); }),
                  {"2 action lists", "p = 3"});
  expect_contains(error_message([&] { simulate_pipeline(deadlocked, 2, 1, -1, 2, 0); }),
                  {"forward -1 s", "expected finite times >= 0"});
  expect_contains(error_message([] { simulate_pipeline(Actions(2), 2, 1, 1, 2, 0); }), {"empty"});
}

TEST(PipelineSim, EachStageRunsAtItsOwnPace) {
  // AFAB, p = 2, m = 2, no p2p; stage 0: F 1 s, B 2 s; stage 1 (the head's): F 2 s, B 4 s.
  // Rank 0 forwards at [0,1] and [1,2]; rank 1 at [1,3] and [3,5], then backwards at [5,9] and
  // [9,13]; rank 0's backwards wait on those: [9,11] and [13,15]. Paced by the slowest stage
  // every chunk would take 2 + 4 s: (m + p - 1) x 6 = 18 s.
  const Actions afab = pipeline_actions(Schedule::AllForwardAllBackward, 2, 2, 1);
  const PipelineTimeline t =
      simulate_pipeline(afab, 2, 1, std::vector<plan::PassTimes>{{1, 1, 1}, {2, 2, 2}}, 0);
  EXPECT_DOUBLE_EQ(t.makespan, 15);
  EXPECT_DOUBLE_EQ(simulate_pipeline(afab, 2, 1, 2, 4, 0).makespan, 18);
  expect_contains(error_message([&] { simulate_pipeline(afab, 2, 1, std::vector<plan::PassTimes>{{1, 1, 1}}, 0); }),
                  {"1 stages' pass times", "p x v = 2"});
  expect_contains(
      error_message([&] {
        simulate_pipeline(afab, 2, 1, std::vector<plan::PassTimes>{{1, 1, 1}, {2, -1, 2}}, 0);
      }),
      {"stage 1", "input-gradient backward -1 s"});
  // A stage with no work of its own passes through (Llama 3's first stage holds only the
  // embedding, sec. 3.3.2): rank 1's forwards [0,2] and [2,4], backwards [4,8] and [8,12]; rank
  // 0's take no time.
  EXPECT_DOUBLE_EQ(
      simulate_pipeline(afab, 2, 1, std::vector<plan::PassTimes>{{0, 0, 0}, {2, 2, 2}}, 0).makespan,
      12);
}

TEST(PipelineSim, RanksSharingCoresTakeTurnsAndIdleRanksLendTheirs) {
  // AFAB, p = 2, m = 2, F = B = 1 s at full speed, one core. Rank 0 forwards mb 0 alone at
  // [0,1]; then its mb 1 and rank 1's mb 0 share the core at half speed and both end at 3; rank
  // 1 forwards mb 1 alone [3,4] and backwards mb 0 [4,5]; its mb-1 backward and rank 0's mb-0
  // backward share [5,7]; rank 0's mb-1 backward runs alone [7,8]. 8 s = the 8 s of work on one
  // core; with a core each the same list takes 6 s (the bubble is idle time again).
  const Actions afab = pipeline_actions(Schedule::AllForwardAllBackward, 2, 2, 1);
  const std::vector<plan::PassTimes> unit(2, plan::PassTimes{1, 0.5, 0.5});
  const auto one_core =
      plan::simulate_pipeline_on_shared_cores(afab, 2, 1, unit, 0, StagePlacement::RoundRobin, 1, 1);
  EXPECT_NEAR(one_core.makespan, 8, 1e-12);
  EXPECT_NEAR(plan::simulate_pipeline_on_shared_cores(afab, 2, 1, unit, 0, StagePlacement::RoundRobin, 2, 1).makespan,
              simulate_pipeline(afab, 2, 1, unit, 0).makespan, 1e-12);
  EXPECT_DOUBLE_EQ(simulate_pipeline(afab, 2, 1, unit, 0).makespan, 6);
  // Two replicas of the pipeline (dp = 2) in lockstep on 2 cores: the same turns as above.
  EXPECT_NEAR(plan::simulate_pipeline_on_shared_cores(afab, 2, 1, unit, 0, StagePlacement::RoundRobin, 2, 2).makespan,
              8, 1e-12);
  expect_contains(error_message([&] {
                    plan::simulate_pipeline_on_shared_cores(afab, 2, 1, unit, 0, StagePlacement::RoundRobin, 0, 1);
                  }),
                  {"cores = 0"});
}

// Hand-derived from stage = chunk * p + rank: with p = 2 and v = 2, rank 1's chunk 0 is stage 1,
// whose output activation goes to stage 2 on rank 0 (the ring closes) and whose gradient comes
// back from there; rank 1's chunk 1 is the last stage, which sends no activation and receives
// no gradient; rank 0's chunk 0 is the first stage.
TEST(PipelineTransfers, FollowTheStagesAroundTheRing) {
  using T = PipeTransfer;
  const auto out_f = transfer_out_of({PipeOp::Forward, 3, 0}, 1, 2, 2);
  ASSERT_TRUE(out_f.has_value());
  EXPECT_EQ(*out_f, (T{PipeMessage::Activation, 3, 2, 1, 0}));
  const auto in_b = transfer_into({PipeOp::Backward, 3, 0}, 1, 2, 2);
  ASSERT_TRUE(in_b.has_value());
  EXPECT_EQ(*in_b, (T{PipeMessage::Gradient, 3, 1, 0, 1}));
  const auto out_b = transfer_out_of({PipeOp::Backward, 5, 1}, 0, 2, 2);  // stage 2 -> stage 1
  ASSERT_TRUE(out_b.has_value());
  EXPECT_EQ(*out_b, (T{PipeMessage::Gradient, 5, 1, 0, 1}));
  EXPECT_FALSE(transfer_out_of({PipeOp::Forward, 0, 1}, 1, 2, 2).has_value());
  EXPECT_FALSE(transfer_into({PipeOp::Backward, 0, 1}, 1, 2, 2).has_value());
  EXPECT_FALSE(transfer_into({PipeOp::Forward, 0, 0}, 0, 2, 2).has_value());
  EXPECT_FALSE(transfer_out_of({PipeOp::Backward, 0, 0}, 0, 2, 2).has_value());
  const auto in_f = transfer_into({PipeOp::Forward, 4, 0}, 2, 4, 1);  // stage 2 from stage 1
  ASSERT_TRUE(in_f.has_value());
  EXPECT_EQ(*in_f, (T{PipeMessage::Activation, 4, 2, 1, 2}));
}

// The order NCCL needs (parallel/pipeline_channels): every schedule the engine runs, over a
// range of shapes, agrees on each channel's order and completes with blocking receives.
TEST(PipelineTransfers, EveryScheduleMatchesInOrderAndCannotDeadlock) {
  int checked = 0;
  for (int64_t p = 2; p <= 8; ++p)
    for (int64_t m = 1; m <= 16; ++m) {
      for (Schedule s : {Schedule::AllForwardAllBackward, Schedule::OneFOneB, Schedule::ZeroBubbleH1}) {
        EXPECT_EQ(pipeline_transfer_problem(pipeline_actions(s, p, m, 1), p, 1), "")
            << schedule_name(s) << " p=" << p << " m=" << m;
        ++checked;
      }
      for (int64_t v = 1; v <= 4; ++v) {
        EXPECT_EQ(pipeline_transfer_problem(forward_only_actions(p, m, v), p, v), "")
            << "forward-only p=" << p << " m=" << m << " v=" << v;
        if (v >= 2 && m % p == 0) {
          EXPECT_EQ(pipeline_transfer_problem(pipeline_actions(Schedule::Interleaved, p, m, v), p, v), "")
              << "interleaved p=" << p << " m=" << m << " v=" << v;
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 200);
}

TEST(PipelineTransfers, ForwardOnlyVisitsMicroBatchesThenChunksOnEveryRank) {
  const Actions a = forward_only_actions(3, 2, 2);
  ASSERT_EQ(a.size(), 3u);
  for (const auto& rank : a) {
    std::string order;
    for (const PipeAction& x : rank) order += show(x) + " ";
    EXPECT_EQ(order, "F0c0 F0c1 F1c0 F1c1 ");
  }
}

TEST(PipelineTransfers, CrossedOrdersAndDeadlocksAreFound) {
  // Rank 1 forwards micro-batch 1 before 0: with tags that would still match, but on a channel
  // that matches in order, micro-batch 0's activation would land in micro-batch 1's forward.
  const Actions crossed = {{{PipeOp::Forward, 0, 0},
                            {PipeOp::Forward, 1, 0},
                            {PipeOp::Backward, 0, 0},
                            {PipeOp::Backward, 1, 0}},
                           {{PipeOp::Forward, 1, 0},
                            {PipeOp::Forward, 0, 0},
                            {PipeOp::Backward, 0, 0},
                            {PipeOp::Backward, 1, 0}}};
  expect_contains(pipeline_transfer_problem(crossed, 2, 1),
                  {"activations from rank 0 to rank 1", "transfer 0",
                   "sent as activation of micro-batch 0 for stage 1",
                   "received as activation of micro-batch 1 for stage 1"});
  // Rank 0 waits for micro-batch 0's gradient before it has sent the activation that makes it.
  const Actions deadlocked = {{{PipeOp::Backward, 0, 0}, {PipeOp::Forward, 0, 0}},
                              {{PipeOp::Forward, 0, 0}, {PipeOp::Backward, 0, 0}}};
  expect_contains(pipeline_transfer_problem(deadlocked, 2, 1),
                  {"deadlock", "rank 0 waits for gradient of micro-batch 0 for stage 0",
                   "rank 1 waits for activation of micro-batch 0 for stage 1"});
  // A message nobody receives: rank 1 skips micro-batch 1.
  Actions missing = pipeline_actions(Schedule::OneFOneB, 2, 2, 1);
  missing[1] = {{PipeOp::Forward, 0, 0}, {PipeOp::Backward, 0, 0}};
  expect_contains(pipeline_transfer_problem(missing, 2, 1),
                  {"transfer 1", "sent as activation of micro-batch 1", "received as nothing"});
  expect_contains(pipeline_transfer_problem(missing, 3, 1), {"2 action lists for 3"});
}

}  // namespace
}  // namespace loom::test
