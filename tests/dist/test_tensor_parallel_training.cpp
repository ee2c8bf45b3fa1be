// `parallel.tp` through the trainer: the whole loop (AdamW, gradient accumulation, clipping,
// the LR schedule) on a dp x tp mesh against one process on the same global batch, and
// checkpoints written at tp > 1 loaded at tp = 1 and by one process.
#include <gtest/gtest.h>

#include <cstring>

#include "dist_fixture.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::test {
namespace {

struct Case {
  std::string arch;
  bool sequence_parallel;
  int zero_stage;
  bool half_tp;  // tp = world / 2 with dp = 2 (at 4 ranks), else tp = world
};

// Heads, kv heads and MLP columns that divide by 4; clipping at 0.05 is active every step.
std::vector<std::string> common_overrides(const std::string& arch) {
  std::vector<std::string> o = {"data.val=\"\"", "optim.eps=1e-5", "optim.lr=1e-3",
                                "optim.grad_clip=0.05", "parallel.bucket_mb=0.002"};
  if (arch == "llama") {
    o.push_back("model.n_head=8");
    o.push_back("model.n_kv_head=4");
  }
  return o;
}

class TensorParallelTraining : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelTraining, FollowsOneProcess) {
  const auto world_group = world();
  const Case c = GetParam();
  const int n = world_group->size();
  const int tp = c.half_tp ? n / 2 : n;
  if (tp < 1 || kGlobalBatch % (n / tp) != 0) GTEST_SKIP() << "layout needs 4 ranks";
  const int dp = n / tp;
  TinyRun run("tp_train_" + c.arch);
  const std::string base = run.config(c.arch, kSteps);
  std::vector<std::string> shared = common_overrides(c.arch);
  shared.push_back("checkpoint.dir=\"\"");
  auto with = [&](std::vector<std::string> extra) { return plus(std::move(extra), shared); };
  Trainer reference(parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""})));
  reference.run();
  Trainer parallel(
      parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch / dp),
                        "parallel.tp=" + std::to_string(tp),
                        "parallel.sequence_parallel=" + std::string(c.sequence_parallel && tp > 1 ? "true" : "false"),
                        "parallel.zero_stage=" + std::to_string(c.zero_stage),
                        "log.dir=\"" + run.dir + "/tp\""})),
      world_group);
  parallel.run();

  if (world_group->rank() == 0) {
    expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/tp/metrics.jsonl");
  }
  const ParameterList& ref = reference.model().parameters();
  const ParameterList& par = parallel.model().parameters();
  ASSERT_EQ(ref.size(), par.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_LE(shard_difference(ref[i]->value, par[i]->placement, par[i]->value), 1e-5) << ref[i]->name << " on rank " << world_group->rank();
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelTraining,
                         ::testing::Values(Case{"gpt2", false, 0, false}, Case{"gpt2", true, 0, false},
                                           Case{"llama", true, 0, false}, Case{"llama", false, 0, false},
                                           Case{"gpt2", true, 1, true}, Case{"llama", true, 1, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return c.arch + (c.sequence_parallel ? "_sp" : "") + "_zero" + std::to_string(c.zero_stage) +
                                  (c.half_tp ? "_dp2" : "");
                         });

// Saved at tp = world (ZeRO-1 over nothing: dp = 1), loaded by one process and at tp = 1
// with dp = world: the same weights bit for bit, and training continues as if never stopped.
TEST(TensorParallelCheckpoint, LoadsAtAnotherTpAndInOneProcess) {
  const auto world_group = world();
  const int n = world_group->size();
  if (n < 2 || kGlobalBatch % n != 0) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::string root = shared_path("tp_ckpt_root");
  TinyRun run("tp_ckpt");
  const std::string base = run.config("llama", 8);
  auto config = [&](int ranks_dp, int tp, const std::string& ckpt, const std::string& log) {
    std::vector<std::string> o = common_overrides("llama");
    for (const std::string& s : std::vector<std::string>{"checkpoint.every=0", "checkpoint.keep_last=0",
                                 "train.batch_size=" + std::to_string(kGlobalBatch / ranks_dp),
                                 "parallel.tp=" + std::to_string(tp),
                                 "checkpoint.dir=\"" + root + "/" + ckpt + "\"",
                                 "log.dir=\"" + run.dir + "/" + log + "\""})
      o.push_back(s);
    return parse(base, o);
  };
  // A: tp = world, the first 4 of 8 steps, saved at step 4.
  TrainConfig first = config(1, n, "a", "a");
  first.steps = 4;
  Trainer a(first, world_group);
  a.run();
  // One process reads A's weights: each rank's shard of them is what A holds, bit for bit.
  {
    Transformer whole(first.model);
    restore_weights(root + "/a", whole);
    for (size_t i = 0; i < whole.parameters().size(); ++i) {
      const Parameter& w = *whole.parameters()[i];
      const Parameter& s = *a.model().parameters()[i];
      const Tensor expected = take_shard(w.value, s.placement);
      EXPECT_EQ(std::memcmp(expected.f32(), s.value.f32(), s.value.nbytes()), 0) << w.name;
    }
  }
  // B: tp = 1, dp = world, ZeRO-1, resumes from A; R: one process, never interrupted.
  TrainConfig resumed = config(n, 1, "a", "b");
  resumed.zero_stage = 1;
  Trainer b(resumed, world_group);
  b.run();
  // Every rank runs R on its own: its checkpoints go to a directory of its own.
  Trainer r(config(1, 1, "r" + std::to_string(world_group->rank()), "r"));
  r.run();
  if (world_group->rank() == 0) {
    const auto b_losses = losses_of(run.dir + "/b/metrics.jsonl");
    const auto r_losses = losses_of(run.dir + "/r/metrics.jsonl");
    ASSERT_EQ(b_losses.size(), 4u) << "B resumes at step 5";
    ASSERT_EQ(r_losses.size(), 8u);
    for (size_t s = 0; s < 4; ++s) EXPECT_NEAR(b_losses[s], r_losses[s + 4], 1e-5 * r_losses[s + 4]) << "step " << s + 5;
  }
  for (size_t i = 0; i < r.model().parameters().size(); ++i)
    EXPECT_LE(relative_weight_difference(r.model().parameters()[i]->value.to_f32_vector(),
                                         b.model().parameters()[i]->value.to_f32_vector()),
              1e-5)
        << r.model().parameters()[i]->name;
}

// A launch whose ranks are not dp x tp is refused before any work, saying what would work.
TEST(TensorParallelLaunch, RanksThatAreNotAMultipleOfTpAreRejected) {
  const auto world_group = world();
  const int n = world_group->size();
  TinyRun run("tp_launch");
  const int tp = 2 * n;  // 8 heads and 128 MLP columns divide by 2, 4 and 8
  const TrainConfig config = parse(run.config("gpt2", 4), {"model.n_head=8", "parallel.tp=" + std::to_string(tp)});
  expect_contains(error_message([&] { Trainer trainer(config, world_group); }),
                  {"launched with " + std::to_string(n) + " rank(s)", "parallel.tp x parallel.pp = " + std::to_string(tp),
                   "launch dp x " + std::to_string(tp)});
}

}  // namespace
}  // namespace loom::test
