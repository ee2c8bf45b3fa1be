// The planner's count of loom's FP8 emulation (plan/engine_fp8.hpp) against what the engine's
// ranks really quantise (Fp8QuantizeTally) in one step under tp (its column-parallel layers'
// two backward halves, each quantising the output gradient), tp with sequence parallelism
// (gathered rows; no bias copy in the row-parallel layers), cp (each rank's chunk) and ep (each
// rank's experts on the rows routed to it). Routed rows differ from rank to rank, so the test
// compares the world's sums: every rank's prediction is the mean rank's (balanced routing), and
// the routed rows of the whole world add up to k x tokens however the router spreads them.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/plan/engine_fp8.hpp"
#include "loom/plan/machine_profile.hpp"

namespace loom::test {
namespace {

struct CountCase {
  std::string name, arch, recipe;
  int tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  std::vector<std::string> model = {};
};

void PrintTo(const CountCase& c, std::ostream* os) { *os << c.name; }

class Fp8PlannerCounts : public ::testing::TestWithParam<CountCase> {};

double world_sum(ProcessGroup& world, int64_t value) {
  float v = static_cast<float>(value);  // counts below 2^24: exact
  world.all_reduce(&v, 1, ReduceOp::Sum)->wait();
  return static_cast<double>(v);
}

TEST_P(Fp8PlannerCounts, AreWhatTheRanksQuantise) {
  const auto world_group = world();
  const CountCase c = GetParam();
  const int n = world_group->size();
  if (n != 2) GTEST_SKIP() << "layouts of 2 ranks";
  const int dp = n / (c.tp * c.cp);
  TinyRun run("fp8_counts_" + c.name);
  std::vector<std::string> overrides = {
      "data.val=\"\"",
      "checkpoint.dir=\"\"",
      "optim.warmup_steps=0",
      "train.precision=\"fp8\"",
      "train.fp8_recipe=\"" + c.recipe + "\"",
      "train.batch_size=" + std::to_string(4 / dp),
      "parallel.tp=" + std::to_string(c.tp),
      "parallel.cp=" + std::to_string(c.cp),
      "parallel.ep=" + std::to_string(c.ep),
      "parallel.sequence_parallel=" + std::string(c.sequence_parallel ? "true" : "false"),
      "log.dir=\"" + run.dir + "/log\""};
  if (c.arch == "llama") overrides.insert(overrides.end(), {"model.n_head=8", "model.n_kv_head=4"});
  overrides.insert(overrides.end(), c.model.begin(), c.model.end());
  Trainer trainer(parse(run.config(c.arch, 1), overrides), world_group);
  fp8_quantize_tally().reset();
  (void)trainer.run();
  const Fp8QuantizeTally& tally = fp8_quantize_tally();

  const ModelConfig& model = trainer.model().config();
  plan::PlanLayout layout;
  layout.tp = c.tp, layout.cp = c.cp, layout.ep = c.ep, layout.dp = dp;
  layout.sequence_parallel = c.sequence_parallel;
  layout.micro_batch = 4 / dp;
  plan::ProfileEntry entry;
  entry.ranks = 1;
  entry.peak_flops = 1e11;
  entry.memory_bytes_per_s = 1e10;
  entry.fp8 = {1e-8, 1e-8, 1e-8, 1e-8};
  plan::ProfiledMachine m = plan::profiled_machine(entry, 1e9);
  m.job.seq_len = 16;
  m.job.engine_fp8.recipe = c.recipe == "current"     ? plan::EngineFp8Recipe::Current
                            : c.recipe == "blockwise" ? plan::EngineFp8Recipe::Blockwise
                                                      : plan::EngineFp8Recipe::Delayed;
  const plan::EngineFp8Cost cost = plan::engine_fp8_layer_cost(model, layout, m.cluster, m.job);
  // Each rank: n_layer layers x 2 micro-batches (the tiny config's grad_accum) in the step.
  const double per_rank = static_cast<double>(model.n_layer) * 2;
  ProcessGroup& w = *world_group;
  EXPECT_EQ(world_sum(w, tally.tensor), n * per_rank * cost.tensor_elements);
  EXPECT_EQ(world_sum(w, tally.row_tiles), n * per_rank * cost.row_tile_elements);
  EXPECT_EQ(world_sum(w, tally.column_tiles), n * per_rank * cost.column_tile_elements);
  EXPECT_EQ(world_sum(w, tally.blocks), n * per_rank * cost.block_elements);
  EXPECT_GT(world_sum(w, tally.tensor + tally.row_tiles), 0);
}

const std::vector<std::string> kMoe = {"model.n_experts=4", "model.experts_per_token=2",
                                       "model.n_shared_experts=1", "model.moe_ffn_hidden=24"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, Fp8PlannerCounts,
    ::testing::Values(CountCase{"gpt2_tp2_delayed", "gpt2", "delayed", 2},
                      CountCase{"gpt2_tp2_sp_current", "gpt2", "current", 2, 1, 1, true},
                      CountCase{"llama_tp2_delayed", "llama", "delayed", 2},
                      CountCase{"gpt2_cp2_current", "gpt2", "current", 1, 2},
                      CountCase{"moe_ep2_delayed", "llama", "delayed", 1, 1, 2, false, kMoe},
                      CountCase{"moe_ep2_blockwise", "llama", "blockwise", 1, 1, 2, false, kMoe},
                      CountCase{"moe_tp2_sp_current", "llama", "current", 2, 1, 1, true, kMoe}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::test
