// FP8 training under tensor, sequence, pipeline and context parallelism against one process on
// the same global batch, for each recipe. A rank must quantise as one process would:
//   - per-tensor recipes (delayed, current): the amaxes are reduced (max) over every rank of a
//     pipeline stage. A tensor-parallel rank holds a slice of each weight, of a row-parallel
//     layer's input and of a column-parallel layer's output gradient; a context-parallel rank
//     other tokens of the same sequences. Without tp in the reduction (checked by mutation) the
//     first loss of tp2 misses by far more than its 1e-6 bound;
//   - blockwise: the 128-wide tiles of a tp slice, and the 128-token tiles of a cp chunk, are
//     tiles one process makes, which the config guarantees (widths 128 x tp multiples, seq_len /
//     2cp a multiple of 128);
//   - pipeline stages hold different layers: each reduces over its own ranks, and the whole
//     model's amax histories (checkpoints carry them) are assembled over the stages.
// Tolerances are those of tests/dist/test_fp8_data_parallel.cpp and for the same reason
// (dist_fixture.hpp, kFlippedWeightMedianTolerance): an operand's last f32 bit differs where the
// runs sum in another order (a tp all-reduce, a cp merge), and where that carries a value across
// a rounding midpoint one quantised element moves a grid step; Adam on random tokens spreads it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dist_fixture.hpp"

namespace loom::test {
namespace {

struct Case {
  std::string name;
  std::string arch;
  std::string recipe;
  int ranks;  // the world size the layout is for; dp = ranks / (tp x pp x cp)
  int tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
  std::string schedule = "1f1b";
  int chunks = 1, zero_stage = 0;
  std::vector<std::string> model = {};  // overrides of the tiny model
  int ep = 1;                           // carved out of dp
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr double kLossTolerance = 1e-4;  // test_fp8_data_parallel.cpp's

class Fp8ModelParallelParity : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8ModelParallelParity, LossesWeightsAndHistoriesMatchOneProcess) {
  const auto world_group = world();
  const Case c = GetParam();
  const int n = world_group->size();
  if (n != c.ranks) GTEST_SKIP() << "layout is for " << c.ranks << " ranks";
  const int dp = n / (c.tp * c.pp * c.cp);
  TinyRun run("fp8_mp_" + c.recipe);
  const std::string base = run.config(c.arch, kSteps);
  std::vector<std::string> shared = {
      "data.val=\"\"",           "optim.eps=1e-5",
      "optim.lr=1e-3",           "parallel.bucket_mb=0.002",
      "train.precision=\"fp8\"", "train.fp8_recipe=\"" + c.recipe + "\"",
      "checkpoint.dir=\"\""};
  if (c.arch == "llama") shared.insert(shared.end(), {"model.n_head=8", "model.n_kv_head=4"});
  if (c.pp > 1) shared.insert(shared.end(), {"model.n_layer=4", "train.grad_accum=4"});
  shared.insert(shared.end(), c.model.begin(), c.model.end());
  auto with = [&](std::vector<std::string> extra) { return plus(std::move(extra), shared); };
  Trainer reference(parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""})));
  reference.run();
  Trainer parallel(
      parse(
          base,
          with({"train.batch_size=" + std::to_string(kGlobalBatch / dp),
                "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                "parallel.cp=" + std::to_string(c.cp), "parallel.ep=" + std::to_string(c.ep),
                "parallel.sequence_parallel=" + std::string(c.sequence_parallel ? "true" : "false"),
                "parallel.pp_schedule=\"" + c.schedule + "\"",
                "parallel.pp_chunks=" + std::to_string(c.chunks),
                "parallel.zero_stage=" + std::to_string(c.zero_stage),
                "log.dir=\"" + run.dir + "/mp\""})),
      world_group);
  parallel.run();
  if (world_group->rank() == 0)
    expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/mp/metrics.jsonl",
                         kLossTolerance);
  const auto ref = by_name(reference.model().parameters());
  for (const Parameter* p : parallel.model().parameters()) {
    ASSERT_TRUE(ref.count(p->name)) << p->name;
    EXPECT_LE(median_shard_difference(ref.at(p->name)->value, p->placement, p->value),
              kFlippedWeightMedianTolerance)
        << p->name << " on rank " << world_group->rank();
  }
  // The whole model's histories (every stage's layers, every ep rank's experts), on every rank.
  expect_fp8_histories_match(reference.fp8_amax_history(), parallel.fp8_amax_history(),
                             static_cast<float>(dp * c.cp), world_group->rank());
}

// Blockwise under cp: 512-token sequences (two chunks of 128 a rank), one micro-batch a step.
// (Blockwise under tp needs slices of whole 128-wide tiles, a model 256 wide at tp2, where one
// quantised element moved by f32 noise already costs the first loss 2e-5 of itself and Adam on
// random tokens spreads it: dp2 at that width, a layout landed earlier, parts ways as much. Its
// tiles are checked exactly on the layers instead: test_fp8_tensor_parallel_layers.cpp.)
// A Llama whose MLPs are 4 experts (top 2) and a shared expert; the balancing loss off, since
// it is not linear in a micro-batch's tokens (tests/dist/test_moe_training.cpp).
const std::vector<std::string> kExperts = {"model.n_experts=4", "model.experts_per_token=2",
                                           "model.n_shared_experts=1", "model.moe_aux_loss_coef=0"};
const std::vector<std::string> kLong = {"model.max_seq_len=512", "train.seq_len=512",
                                        "train.grad_accum=1"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, Fp8ModelParallelParity,
    ::testing::Values(
        Case{"tp2_gpt2_delayed", "gpt2", "delayed", 2, 2},
        Case{"tp2_sp_gpt2_current", "gpt2", "current", 2, 2, 1, 1, true},
        Case{"tp2_sp_llama_delayed", "llama", "delayed", 2, 2, 1, 1, true},
        Case{"pp2_gpt2_delayed", "gpt2", "delayed", 2, 1, 2},
        Case{"pp2_interleaved_llama_current", "llama", "current", 2, 1, 2, 1, false, "interleaved",
             2},
        Case{"pp2_zbh1_gpt2_blockwise", "gpt2", "blockwise", 2, 1, 2, 1, false, "zbh1"},
        Case{"pp2_afab_gpt2_delayed", "gpt2", "delayed", 2, 1, 2, 1, false, "afab"},
        Case{"pp2_zbv_llama_current", "llama", "current", 2, 1, 2, 1, false, "zbv", 2},
        Case{"pp2_dualpipev_gpt2_delayed", "gpt2", "delayed", 2, 1, 2, 1, false, "dualpipev", 2},
        Case{"cp2_gpt2_delayed", "gpt2", "delayed", 2, 1, 1, 2},
        Case{"cp2_llama_current", "llama", "current", 2, 1, 1, 2},
        Case{"cp2_gpt2_blockwise", "gpt2", "blockwise", 2, 1, 1, 2, false, "1f1b", 1, 0, kLong},
        Case{"dp2_tp2_zero1_llama_delayed", "llama", "delayed", 4, 2, 1, 1, true, "1f1b", 1, 1},
        Case{"tp2_pp2_sp_gpt2_current", "gpt2", "current", 4, 2, 2, 1, true},
        Case{"cp2_tp2_gpt2_delayed", "gpt2", "delayed", 4, 2, 1, 2},
        Case{"dp2_pp2_zero1_gpt2_blockwise", "gpt2", "blockwise", 4, 1, 2, 1, false, "1f1b", 1, 1},
        // Experts: their amaxes reduced over the ranks holding them (expert data parallelism),
        // their histories assembled over ep.
        Case{"ep2_moe_delayed", "llama", "delayed", 2, 1, 1, 1, false, "1f1b", 1, 0, kExperts, 2},
        Case{"ep2_moe_current", "llama", "current", 2, 1, 1, 1, false, "1f1b", 1, 0, kExperts, 2},
        Case{"dp2_zero1_moe_current", "llama", "current", 2, 1, 1, 1, false, "1f1b", 1, 1,
             kExperts},
        Case{"tp2_sp_moe_delayed", "llama", "delayed", 2, 2, 1, 1, true, "1f1b", 1, 0, kExperts},
        Case{"pp2_moe_current", "llama", "current", 2, 1, 2, 1, false, "1f1b", 1, 0, kExperts},
        // ep over the ranks of cp (no ep axis in the mesh), and full recomputation (the experts'
        // forward quantised again in the backward).
        Case{"ep2_over_cp2_moe_current", "llama", "current", 2, 1, 1, 2, false, "1f1b", 1, 0,
             kExperts, 2},
        Case{"ep2_full_recompute_moe_delayed",
             "llama",
             "delayed",
             2,
             1,
             1,
             1,
             false,
             "1f1b",
             1,
             0,
             {"model.n_experts=4", "model.experts_per_token=2", "model.n_shared_experts=1",
              "model.moe_aux_loss_coef=0", "model.recompute=\"full\""},
             2},
        // The first stage without experts (its expert group has no layer to reduce).
        Case{"pp2_first_dense_moe_delayed",
             "llama",
             "delayed",
             2,
             1,
             2,
             1,
             false,
             "1f1b",
             1,
             0,
             {"model.n_experts=4", "model.experts_per_token=2", "model.moe_aux_loss_coef=0",
              "model.moe_first_dense=2"}},
        Case{"dp4_ep2_zero1_moe_current", "llama", "current", 4, 1, 1, 1, false, "1f1b", 1, 1,
             kExperts, 2},
        Case{"ep2_tp2_sp_moe_delayed", "llama", "delayed", 4, 2, 1, 1, true, "1f1b", 1, 0, kExperts,
             2}),
    [](const auto& info) { return info.param.name; });

// A pipeline run's checkpoint carries the whole model's histories, assembled from its stages:
// one process, and a pipeline again, resume from it with exactly the histories the stages held.
TEST(Fp8ModelParallelCheckpoint, PipelineHistoriesResumeInOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "a 2-stage pipeline";
  TinyRun run("fp8_pp_ckpt");
  const std::string root = shared_path("fp8_pp_ckpt");
  const std::string base = run.config("gpt2", 4);
  const std::vector<std::string> shared = {
      "data.val=\"\"",         "train.precision=\"fp8\"",         "model.n_layer=4",
      "train.grad_accum=4",    "checkpoint.dir=\"" + root + "\"", "checkpoint.every=4",
      "checkpoint.async=false"};
  Trainer pipeline(parse(base, plus({"parallel.pp=2", "log.dir=\"" + run.dir + "/pp\""}, shared)),
                   world_group);
  pipeline.run();
  const std::vector<float> saved = pipeline.fp8_amax_history();
  // Each stage holds half the layers: its own history has the other half zero.
  const std::vector<float> own = pipeline.model().fp8()->amax_history();
  ASSERT_EQ(own.size(), saved.size());
  const size_t half = saved.size() / 2;
  const bool first_stage = world_group->rank() == 0;
  for (size_t k = 0; k < saved.size(); ++k) {
    if ((k < half) != first_stage) {
      ASSERT_EQ(own[k], 0.0f) << k;
    }
  }
  size_t recorded = 0;
  for (size_t k = 0; k < saved.size(); ++k) recorded += saved[k] > 0.0f;
  EXPECT_EQ(recorded, saved.size() / kDefaultFp8AmaxHistory * 4)  // 4 steps of every operand
      << "every layer's history, from both stages";
  if (world_group->rank() == 0) {
    Trainer one(parse(base, plus({"log.dir=\"" + run.dir + "/one\""}, shared)));
    EXPECT_EQ(one.restore(root), 4);
    EXPECT_EQ(one.fp8_amax_history(), saved);
  }
  // And a pipeline again: each stage takes its own layers' histories back.
  Trainer again(parse(base, plus({"parallel.pp=2", "log.dir=\"" + run.dir + "/again\""}, shared)),
                world_group);
  EXPECT_EQ(again.restore(root), 4);
  EXPECT_EQ(again.model().fp8()->amax_history(), own);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_group->rank() == 0) std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace loom::test
