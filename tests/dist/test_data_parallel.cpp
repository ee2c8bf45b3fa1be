// Data parallelism against one process: N ranks, each training on its 1/N of every global
// batch with bucketed gradient all-reduce, must follow the single-process run (same global
// batch) step by step. Every rank also trains the single-process reference itself (no group
// at all), so the comparison needs no data from other ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "../trainer_fixture.hpp"
#include "loom/dist/mpi_process_group.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/train/trainer.hpp"

namespace loom::test {
namespace {

constexpr int64_t kGlobalBatch = 8, kSteps = 10;

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides) {
  ConfigReader reader = ConfigReader::from_string(text, "dp-test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

std::vector<double> losses_of(const std::string& metrics_path) {
  std::vector<double> out;
  for (const auto& r : MetricsLog::read_all(metrics_path))
    if (r["kind"] == "train") out.push_back(r["loss"].get<double>());
  return out;
}

std::shared_ptr<ProcessGroup> world() {
  return std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, "dp",
                                           MpiProcessGroup::CommOwnership::Borrowed);
}

struct Case {
  std::string arch;
  int64_t grad_accum;
  int zero_stage;
};

class DataParallelParity : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelParity, LossesAndWeightsMatchOneProcess) {
  const auto dp = world();
  if (kGlobalBatch % dp->size() != 0)
    GTEST_SKIP() << "global batch 8 does not split over " << dp->size();
  const Case c = GetParam();
  TinyRun run("dp_" + c.arch);
  const std::string base = run.config(c.arch, kSteps);
  const std::vector<std::string> common = {"checkpoint.dir=\"\"", "data.val=\"\"",
                                           "train.grad_accum=" + std::to_string(c.grad_accum),
                                           "parallel.zero_stage=" + std::to_string(c.zero_stage),
                                           "parallel.bucket_mb=0.002",  // several buckets
                                           // Adam divides each gradient by its own size: with
                                           // eps below f32 summation noise (~1e-9 here), an
                                           // element whose true gradient is 0 (GPT-2's key
                                           // bias) moves by +-lr per step in a direction set by
                                           // rounding, in any two runs that sum in a different
                                           // order. eps = 1e-6 keeps such noise from steering.
                                           "optim.eps=1e-6", "optim.lr=1e-3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Trainer reference(parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""})));
  reference.run();
  Trainer parallel(
      parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch / dp->size()),
                        "log.dir=\"" + run.dir + "/dp\""})),
      dp);
  parallel.run();

  if (dp->rank() == 0) {  // rank 0 writes the metrics of the parallel run
    const auto ref_losses = losses_of(run.dir + "/ref/metrics.jsonl");
    const auto dp_losses = losses_of(run.dir + "/dp/metrics.jsonl");
    ASSERT_EQ(ref_losses.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(dp_losses.size(), ref_losses.size());
    EXPECT_NEAR(dp_losses[0], ref_losses[0], 1e-6 * ref_losses[0]) << "first step";
    for (size_t s = 0; s < ref_losses.size(); ++s)
      EXPECT_NEAR(dp_losses[s], ref_losses[s], 1e-5 * ref_losses[s]) << "step " << s + 1;
  }
  // Every rank ends with the same weights as the single process.
  const ParameterList& ref_params = reference.model().parameters();
  const ParameterList& dp_params = parallel.model().parameters();
  for (size_t i = 0; i < ref_params.size(); ++i) {
    const auto a = ref_params[i]->value.to_f32_vector(), b = dp_params[i]->value.to_f32_vector();
    // Relative to the tensor's largest weight, floored at the init scale (std 0.02): biases
    // start at zero, and their own maximum after 10 small steps is no scale to compare to.
    constexpr double kInitScale = 0.02;
    double max_diff = 0, max_ref = kInitScale;
    for (size_t k = 0; k < a.size(); ++k) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[k] - b[k])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(a[k])));
    }
    EXPECT_LE(max_diff / max_ref, 1e-5) << ref_params[i]->name << " on rank " << dp->rank();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelParity,
                         ::testing::Values(Case{"gpt2", 1, 0}, Case{"llama", 1, 0}, Case{"gpt2", 2, 0},
                                           Case{"gpt2", 1, 1}, Case{"llama", 2, 1}),
                         [](const auto& info) {
                           return info.param.arch + "_accum" +
                                  std::to_string(info.param.grad_accum) + "_zero" +
                                  std::to_string(info.param.zero_stage);
                         });

TEST(DataParallel, BucketsAreReducedDuringBackwardAndBytesMatchTheRingFormula) {
  const auto dp = world();
  TinyRun run("dp_overlap");
  Trainer trainer(parse(run.config("gpt2", 1),
                        {"checkpoint.dir=\"\"", "data.val=\"\"", "parallel.bucket_mb=0.002",
                         "optim.warmup_steps=0", "train.batch_size=2",
                         "log.trace=\"" + run.dir + "/trace.json\"",
                         "log.dir=\"" + run.dir + "/dp\""}),
                  dp);
  dp->reset_stats();
  trainer.run();
  if (dp->size() == 1) {
    EXPECT_EQ(trainer.reducer(), nullptr);  // one rank: nothing to reduce
    return;
  }
  const GradientBucketReducer& reducer = *trainer.reducer();
  ASSERT_GT(reducer.bucket_count(), 2);
  // The first bucket (output head and last layers) left before backward reached the
  // embeddings: its reduction overlapped the rest of backward.
  EXPECT_LT(reducer.last_timings().front().params_ready_before_issue, reducer.parameter_count());
  // Wire bytes: one ring all-reduce per bucket plus the 4-byte loss average, per step.
  int64_t expected = ring_all_reduce_wire_bytes(4, dp->size()).sent;
  expected += reducer.expected_all_reduce_wire_bytes();
  EXPECT_EQ(dp->stats().sent(CommOp::AllReduce), expected);
  EXPECT_EQ(dp->stats().count(CommOp::AllReduce), reducer.bucket_count() + 1);
  // The trace shows it too: a bucket's all-reduce starts before the backward span ends.
  std::ifstream trace_file(run.dir + "/trace.json.rank" + std::to_string(dp->rank()));
  const nlohmann::json trace = nlohmann::json::parse(trace_file);
  double backward_end = -1, first_reduce_start = 1e300;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>(), end = ts + e["dur"].get<double>();
    if (e["name"] == "backward") backward_end = std::max(backward_end, end);
    if (e["name"].get<std::string>().rfind("all_reduce", 0) == 0) first_reduce_start = std::min(first_reduce_start, ts);
  }
  EXPECT_GT(backward_end, 0);
  EXPECT_LT(first_reduce_start, backward_end);
  // The step's metrics line carries the same figures, and the memory by category.
  if (dp->rank() == 0) {
    const auto records = MetricsLog::read_all(run.dir + "/dp/metrics.jsonl");
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["comm"]["all_reduce"]["bytes_sent"].get<int64_t>(), expected);
    EXPECT_EQ(records[0]["memory_peak_bytes"]["comm_buffers"].get<int64_t>(),
              trainer.reducer()->parameter_count() > 0 ? HostAllocator::instance().live_bytes(MemCategory::CommBuffers)
                                                        : 0);
    EXPECT_GT(records[0]["memory_peak_bytes"]["parameters"].get<int64_t>(), 0);
  }
}

TEST(ZeroStage1, ShardsOptimizerStateOverRanks) {
  const auto dp = world();
  TinyRun run("zero1_memory");
  const int64_t before = HostAllocator::instance().live_bytes(MemCategory::OptimizerState);
  Trainer trainer(parse(run.config("llama", 2), {"checkpoint.dir=\"\"", "data.val=\"\"",
                                                  "parallel.zero_stage=1", "parallel.bucket_mb=0.002",
                                                  "optim.warmup_steps=0",
                                                  "log.dir=\"" + run.dir + "/z\""}),
                  dp);
  const int64_t optimizer_bytes = HostAllocator::instance().live_bytes(MemCategory::OptimizerState) - before;
  int64_t params = 0;
  for (const Parameter* p : trainer.model().parameters()) params += p->value.numel();
  if (dp->size() == 1) {  // one rank: plain AdamW, two full moments
    EXPECT_EQ(optimizer_bytes, 2 * 4 * params);
    return;
  }
  const ZeroStage1Optimizer& zero = *trainer.zero_optimizer();
  // Two moments of this rank's slice of every bucket: 1/N of the model, up to bucket padding
  // (each bucket is rounded up to a multiple of N elements).
  EXPECT_EQ(optimizer_bytes, 2 * 4 * zero.shard_elements());
  EXPECT_GE(zero.shard_elements() * dp->size(), params);
  EXPECT_LT(zero.shard_elements() * dp->size() - params, dp->size() * 64);
  dp->reset_stats();
  trainer.run();
  // Per step: reduce-scatter and all-gather move (N-1)/N of the (padded) model each.
  EXPECT_EQ(dp->stats().sent(CommOp::ReduceScatter), dp->stats().sent(CommOp::AllGather));
  EXPECT_EQ(dp->stats().count(CommOp::ReduceScatter), dp->stats().count(CommOp::AllGather));
}

TEST(ZeroStage1, CheckpointLoadsInOneProcessAndContinuesTheSameRun) {
  const auto dp = world();
  if (kGlobalBatch % dp->size() != 0) GTEST_SKIP();
  // One checkpoint directory for the whole job: rank 0's, announced to the others.
  int root_pid = ::getpid();
  MPI_Bcast(&root_pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string shared_ckpt = "/tmp/loom_zero1_ckpt_" + std::to_string(root_pid);
  TinyRun run("zero1_ckpt");
  const std::string base = run.config("gpt2", kSteps);
  const std::vector<std::string> common = {"data.val=\"\"", "optim.eps=1e-6", "optim.lr=1e-3",
                                           "parallel.bucket_mb=0.002", "checkpoint.every=5"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  // dp ranks with ZeRO-1 train 5 of 10 steps and checkpoint (moments gathered to rank 0).
  TrainConfig first = parse(base, with({"parallel.zero_stage=1", "checkpoint.dir=\"" + shared_ckpt + "\"",
                                        "train.batch_size=" + std::to_string(kGlobalBatch / dp->size()),
                                        "log.dir=\"" + run.dir + "/z\""}));
  first.steps = 5;  // the schedule still spans 10 steps
  Trainer(first, dp).run();
  if (dp->rank() == 0) {
    // One process resumes from that checkpoint and finishes; another runs all 10 steps.
    Trainer resumed(parse(base, with({"checkpoint.dir=\"" + shared_ckpt + "\"",
                                      "train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/r\""})));
    EXPECT_EQ(resumed.run().first_step, 5);
    Trainer straight(parse(base, with({"checkpoint.dir=\"\"", "train.batch_size=" + std::to_string(kGlobalBatch),
                                       "log.dir=\"" + run.dir + "/s\""})));
    straight.run();
    for (size_t i = 0; i < straight.model().parameters().size(); ++i) {
      const auto a = straight.model().parameters()[i]->value.to_f32_vector();
      const auto b = resumed.model().parameters()[i]->value.to_f32_vector();
      double max_diff = 0, max_ref = 0.02;  // same floor as the parity test above
      for (size_t k = 0; k < a.size(); ++k) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[k] - b[k])));
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(a[k])));
      }
      EXPECT_LE(max_diff / max_ref, 1e-5) << straight.model().parameters()[i]->name;
    }
    std::filesystem::remove_all(shared_ckpt);
  }
  dp->barrier();
}

}  // namespace
}  // namespace loom::test
