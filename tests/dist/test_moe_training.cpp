// Mixture-of-experts models on a mesh (expert parallelism not yet: every rank holds every
// expert): data parallelism with ZeRO, pipeline stages and context parallelism follow one
// process on the same global batch. The balancing loss weighs each micro-batch's own routing
// (f_i P_i is not linear in the tokens), so layouts that split a micro-batch's tokens over
// ranks (dp, cp) train without it, and the z-loss (a mean over tokens, which splits exactly)
// stands in; pipeline stages see whole micro-batches and keep it. First loss 1e-6, every
// loss 1e-5, weights 1e-5 (f32).
#include <gtest/gtest.h>

#include <map>

#include "dist_fixture.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/parallel/zero_optimizer.hpp"

namespace loom::test {
namespace {

struct MoeCase {
  int dp = 1, pp = 1, cp = 1, zero_stage = 0;
  std::string router = "softmax";
  std::string recompute = "none";
  int ranks() const { return dp * pp * cp; }
  bool splits_micro_batches() const { return dp > 1 || cp > 1; }
};

std::string moe_case_name(const MoeCase& c) {
  return c.router + (c.dp > 1 ? "_dp" + std::to_string(c.dp) : "") +
         (c.zero_stage > 0 ? "_zero" + std::to_string(c.zero_stage) : "") +
         (c.pp > 1 ? "_pp" + std::to_string(c.pp) : "") + (c.cp > 1 ? "_cp" + std::to_string(c.cp) : "") + "_" +
         c.recompute + "_np" + std::to_string(c.ranks());
}

void PrintTo(const MoeCase& c, std::ostream* os) { *os << moe_case_name(c); }

class MoeTraining : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeTraining, FollowsOneProcess) {
  const auto world_group = world();
  const MoeCase c = GetParam();
  if (world_group->size() != c.ranks()) GTEST_SKIP() << "layout is for " << c.ranks() << " ranks";
  TinyRun run("moe_train");
  const std::string base = run.config("llama", kSteps);  // seq_len 16, grad_accum 2
  const std::vector<std::string> shared = {
      "data.val=\"\"", "optim.eps=1e-5", "optim.lr=1e-3", "optim.grad_clip=0.05", "parallel.bucket_mb=0.002",
      "checkpoint.dir=\"\"", "model.n_experts=4", "model.experts_per_token=2", "model.moe_z_loss_coef=0.01",
      "model.moe_router=\"" + c.router + "\"", "model.recompute=\"" + c.recompute + "\"",
      c.splits_micro_batches() ? "model.moe_aux_loss_coef=0" : "model.moe_aux_loss_coef=0.05"};
  Trainer reference(parse(base, plus({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""}, shared)));
  reference.run();
  Trainer parallel(parse(base, plus({"train.batch_size=" + std::to_string(kGlobalBatch / c.dp),
                                     "parallel.pp=" + std::to_string(c.pp), "parallel.cp=" + std::to_string(c.cp),
                                     "parallel.zero_stage=" + std::to_string(c.zero_stage),
                                     "log.dir=\"" + run.dir + "/par\""},
                                    shared)),
                   world_group);
  parallel.run();
  if (world_group->rank() == 0) expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/par/metrics.jsonl");
  if (ZeroOptimizer* zero = parallel.zero_optimizer()) zero->materialize_parameters();
  std::map<std::string, const Parameter*> ref;
  for (const Parameter* p : reference.model().parameters()) ref[p->name] = p;
  int experts = 0;
  for (const Parameter* p : parallel.model().parameters()) {
    ASSERT_TRUE(ref.count(p->name)) << p->name;
    experts += p->name.find("block_sparse_moe") != std::string::npos;
    EXPECT_LE(shard_difference(ref.at(p->name)->value, p->placement, p->value), 1e-5)
        << p->name << " on rank " << world_group->rank();
  }
  EXPECT_GT(experts, 0) << "every rank holds some experts";
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeTraining,
                         ::testing::Values(MoeCase{.dp = 2, .zero_stage = 1}, MoeCase{.dp = 2, .zero_stage = 3},
                                           MoeCase{.pp = 2}, MoeCase{.pp = 2, .router = "sigmoid"},
                                           MoeCase{.pp = 2, .recompute = "full"}, MoeCase{.cp = 2},
                                           MoeCase{.dp = 2, .pp = 2, .zero_stage = 1},
                                           MoeCase{.dp = 2, .cp = 2, .recompute = "selective"}),
                         [](const auto& info) { return moe_case_name(info.param); });

// The sigmoid router's selection biases live on the pipeline stage of their layer; a pp=2
// checkpoint carries every layer's, so one process resuming from it holds all of them.
TEST(MoeCheckpoint, EveryStagesBiasesResumeInOneProcess) {
  const auto world_group = world();
  if (world_group->size() != 2) GTEST_SKIP() << "pp = 2";
  TinyRun run("moe_ckpt");
  const std::string root = shared_path("moe_ckpt");
  const std::string base = run.config("llama", 4);
  const std::vector<std::string> shared = {"data.val=\"\"", "model.n_experts=4", "model.experts_per_token=2",
                                           "model.moe_router=\"sigmoid\"", "model.moe_bias_rate=0.01",
                                           "train.batch_size=" + std::to_string(kGlobalBatch), "checkpoint.every=4"};
  Trainer parallel(parse(base, plus({"parallel.pp=2", "checkpoint.dir=\"" + root + "/pp\"",
                                     "log.dir=\"" + root + "/pp_log\""},
                                    shared)),
                   world_group);
  parallel.run();
  std::vector<float> biases = parallel.model().moe_biases();  // this stage's layers, zeros elsewhere
  comm::all_reduce(*world_group, biases.data(), static_cast<int64_t>(biases.size()), ReduceOp::Sum)->wait();
  world_group->barrier();
  if (world_group->rank() == 0) {
    Trainer one(parse(base, plus({"checkpoint.dir=\"" + root + "/pp\"", "checkpoint.resume=true", "train.steps=4",
                                  "log.dir=\"" + root + "/one_log\""},
                                 shared)));
    one.run();  // resumes at step 4 of 4: nothing left to train
    EXPECT_EQ(one.model().moe_biases(), biases);
    EXPECT_NE(biases, std::vector<float>(biases.size(), 0.0f));
  }
  world_group->barrier();
}

}  // namespace
}  // namespace loom::test
