// The planner's charts are drawn from the same numbers it prints: one bar per candidate with
// its memory categories, one span per forward/backward of the simulated schedule.
#include <gtest/gtest.h>

#include <regex>

#include "loom/plan/pipeline_sim.hpp"
#include "loom/plan/plan_charts.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

plan::Candidate evaluate(const ModelConfig& m, const plan::PlanLayout& l, int64_t seq, int64_t global_batch) {
  plan::ClusterSpec cluster;
  cluster.gpus_per_node = 8;
  cluster.nodes = l.gpus() / 8;
  plan::TrainingJob job;
  job.seq_len = job.memory.seq_len = seq;
  job.global_batch = global_batch;
  job.memory.micro_batches = global_batch / (l.dp * l.micro_batch);
  return {l, plan::predict_gpu_memory(m, l, job.memory), plan::predict_step_time(m, l, cluster, job), ""};
}

TEST(PlanCharts, TimelineHasEveryPassOfTheScheduleAndItsSimulatedBubble) {
  const ModelConfig m = model_preset("llama-8b");
  plan::PlanLayout l = plan::parse_layout("tp=2,pp=4,v=2,dp=2,mbs=1,schedule=interleaved");
  const plan::Candidate c = evaluate(m, l, 2048, 16);
  ASSERT_EQ(c.time.micro_batches, 8);
  const std::string svg = plan::pipeline_timeline_svg(c, "t");
  EXPECT_EQ(count(svg, "class=\"span forward\""), 4u * 2 * 8);
  EXPECT_EQ(count(svg, "class=\"span backward\""), 4u * 2 * 8);
  // The subtitle's bubble is the simulation's.
  const plan::PipelineTimeline sim =
      plan::simulate_pipeline(pipeline_actions(l.schedule, 4, 8, 2), 4, 2, c.time.chunk_forward_s, c.time.chunk_backward_s, c.time.p2p_s);
  char bubble[32];
  std::snprintf(bubble, sizeof bubble, "bubble %.1f%%", 100 * sim.bubble_fraction);
  EXPECT_NE(svg.find(bubble), std::string::npos) << bubble;
  EXPECT_GT(sim.bubble_fraction, 0.05);
  // Too many passes to draw is an error that says how many.
  expect_contains(error_message([&] { plan::pipeline_timeline_svg(c, "t", 100); }), {"128 forward and backward passes"});
}

TEST(PlanCharts, MemoryChartHasOneBarPerCandidateWithItsCategories) {
  const ModelConfig m = model_preset("llama-8b");
  std::vector<plan::Candidate> candidates;
  for (const char* text : {"tp=8,dp=1,recompute=full,sp=1", "tp=2,dp=4,zero=3", "tp=1,dp=8,zero=1,recompute=selective"})
    candidates.push_back(evaluate(m, plan::parse_layout(text), 4096, 64));
  const std::string svg = plan::memory_chart_svg(candidates, 72.0 * (1 << 30), "m");
  // ZeRO-3 over 4 still holds gradients and parameters; every candidate has activations.
  EXPECT_EQ(count(svg, ": activations "), 3u);
  EXPECT_EQ(count(svg, ": workspace "), 3u);
  for (const plan::Candidate& c : candidates) EXPECT_NE(svg.find(c.layout.describe().substr(0, 9)), std::string::npos);
  EXPECT_NE(svg.find("usable HBM"), std::string::npos);
}

}  // namespace
}  // namespace loom::test
