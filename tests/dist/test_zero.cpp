// ZeRO stages 0-3 against the textbook: per-rank memory of parameters, gradients and optimizer
// state read from the allocator, and bytes on the wire per step read from the process group,
// both compared with the fractions of Rajbhandari et al. (SC'20, sec. 5 and 7) computed from
// the parameter count alone, up to the padding of each flat buffer to a multiple of N.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"
#include "loom/plan/memory_model.hpp"

namespace loom::test {
namespace {

class ZeroStages : public ::testing::TestWithParam<int> {};

TEST_P(ZeroStages, MemoryAndWireBytesPerStepMatchTheTextbook) {
  const auto dp = world();
  const int stage = GetParam();
  const int64_t n = dp->size();
  TinyRun run("zero_stage" + std::to_string(stage));
  const MemStats before = HostAllocator::instance().stats();
  Trainer trainer(parse(run.config("llama", 2), {"checkpoint.dir=\"\"", "data.val=\"\"", "train.grad_accum=1",
                                                  "parallel.zero_stage=" + std::to_string(stage),
                                                  "parallel.bucket_mb=0.002", "optim.warmup_steps=0",
                                                  "log.all_ranks=true", "log.dir=\"" + run.dir + "/z\""}),
                  dp);
  trainer.run();
  int64_t params = 0;  // P, counted on a plain copy of the model (after `after` is read below)
  const MemStats after = HostAllocator::instance().stats();
  auto live = [&](MemCategory c) {
    const size_t i = static_cast<size_t>(c);
    return after.live_bytes[i] - before.live_bytes[i];
  };
  const Transformer plain(trainer.model().config());
  for (const Parameter* p : plain.parameters()) params += p->value.numel();
  // With one rank there is nothing to shard: every stage is plain AdamW.
  const int effective = n > 1 ? stage : 0;
  ZeroOptimizer* zero = trainer.zero_optimizer();
  ASSERT_EQ(zero != nullptr, effective > 0);
  int64_t flats = 0, shard = 0, root_shard = 0;
  if (zero) {
    for (const ZeroOptimizer::FlatSize& f : zero->flat_sizes()) {
      ++flats;
      shard += f.shard;
      if (f.root_unit) root_shard = f.shard;
    }
  }
  // Textbook fractions of 4 bytes x P: parameters 1/N from stage 3, gradients from stage 2,
  // AdamW's two moments from stage 1; each flat adds fewer than N padding elements.
  const double p4 = 4.0 * static_cast<double>(params);
  const double pad = 4.0 * static_cast<double>(flats * n);
  auto fraction = [&](int from_stage) { return effective >= from_stage ? 1.0 / static_cast<double>(n) : 1.0; };
  EXPECT_NEAR(live(MemCategory::Parameters), p4 * fraction(3), pad) << "parameters";
  EXPECT_NEAR(live(MemCategory::Gradients), p4 * fraction(2), pad) << "gradients";
  EXPECT_NEAR(live(MemCategory::OptimizerState), 2 * p4 * fraction(1), 2 * pad) << "optimizer state";
  EXPECT_GE(live(MemCategory::Parameters), p4 * fraction(3));
  // The planner's model of the engine predicts, without building anything, each category's
  // peak within the last step (the allocator's window restarts every step): what stays after
  // it, and for stages 2-3 the full-size gradients (and stage 3 the gathered units) it holds
  // on the way.
  auto peak = [&](MemCategory c) {
    const size_t i = static_cast<size_t>(c);
    return after.peak_bytes[i] - before.live_bytes[i];
  };
  const plan::MemoryBreakdown predicted =
      plan::predict_engine_memory(trainer.model().config(), n, stage, 2000, false, 4, 16, Recompute::None);
  EXPECT_EQ(predicted.parameters, peak(MemCategory::Parameters));
  EXPECT_EQ(predicted.gradients, peak(MemCategory::Gradients));
  EXPECT_EQ(predicted.optimizer_state, peak(MemCategory::OptimizerState));
  if (effective < 2) {
    EXPECT_EQ(peak(MemCategory::Parameters), live(MemCategory::Parameters));
    EXPECT_EQ(peak(MemCategory::Gradients), live(MemCategory::Gradients));
  } else {
    EXPECT_GT(peak(MemCategory::Gradients), live(MemCategory::Gradients));
  }
  if (zero) {  // and to the byte against the padded layout
    EXPECT_EQ(live(MemCategory::OptimizerState), 2 * 4 * shard);
    EXPECT_EQ(live(MemCategory::Gradients), 4 * (effective >= 2 ? shard : shard * n));
    EXPECT_EQ(live(MemCategory::Parameters), 4 * (effective >= 3 ? shard : shard * n));
  }

  // Wire bytes of the last step (stats restart every step), per rank, ring algorithms.
  const CommStats& comm = dp->stats();
  // Every rank logged its own figures (log.all_ranks): the last record holds this step's.
  const std::string own_log = run.dir + "/z/" + (dp->rank() == 0 ? std::string("metrics.jsonl")
                                                                 : "metrics.rank" + std::to_string(dp->rank()) + ".jsonl");
  const auto records = MetricsLog::read_all(own_log);
  ASSERT_EQ(records.size(), 2u) << own_log;
  if (n > 1) {
    EXPECT_EQ(records.back()["comm"]["all_reduce"]["bytes_sent"].get<int64_t>(), comm.sent(CommOp::AllReduce));
  }
  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);
  if (effective == 0) {
    // One all-reduce of all gradients, 2 (N-1)/N x 4P, plus the 4-byte loss average.
    const double expected = 2 * ring * p4 + static_cast<double>(ring_all_reduce_wire_bytes(4, static_cast<int>(n)).sent);
    EXPECT_NEAR(static_cast<double>(comm.sent(CommOp::AllReduce)), expected, 4.0 * 64 * n);
    EXPECT_EQ(comm.sent(CommOp::ReduceScatter), 0);
    EXPECT_EQ(comm.sent(CommOp::AllGather), 0);
    return;
  }
  // Reduce-scatter of the gradients: (N-1)/N x 4P (padded: (N-1) x 4 x shard, exactly).
  EXPECT_EQ(comm.sent(CommOp::ReduceScatter), (n - 1) * 4 * shard);
  EXPECT_NEAR(static_cast<double>(comm.sent(CommOp::ReduceScatter)), ring * p4, pad);
  if (effective < 3) {
    // Stages 1-2: the updated parameters come back in one all-gather: together one all-reduce.
    EXPECT_EQ(comm.sent(CommOp::AllGather), (n - 1) * 4 * shard);
    EXPECT_NEAR(static_cast<double>(comm.sent(CommOp::ReduceScatter) + comm.sent(CommOp::AllGather)), 2 * ring * p4,
                2 * pad);
  } else {
    // Stage 3: parameters are gathered for forward and again for backward (the root unit,
    // kept across both, once): 3 x (N-1)/N x 4P in all, the paper's 1.5x of data parallelism.
    EXPECT_EQ(comm.sent(CommOp::AllGather), (n - 1) * 4 * (2 * shard - root_shard));
    EXPECT_GT(comm.sent(CommOp::AllGather), comm.sent(CommOp::ReduceScatter));
    EXPECT_LE(static_cast<double>(comm.sent(CommOp::AllGather)), 2 * ring * p4 + 2 * pad);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStages, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

}  // namespace
}  // namespace loom::test
