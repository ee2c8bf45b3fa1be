// Checkpoints across layouts: dp = N ZeRO-3 -> dp = N/2 ZeRO-1 -> one process -> dp = N
// ZeRO-3. Each hop loads the previous checkpoint and saves it again at once; every tensor
// (weights, both moments, fp32 masters) must come back bit for bit, and training continued
// from the last hop must produce the same losses as a run never interrupted.
#include <gtest/gtest.h>

#include <cstring>

#include "dist_fixture.hpp"
#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::test {
namespace {

constexpr int64_t kFirstSteps = 4, kTotalSteps = 8;

// Every tensor of `a`, read whole, equals the same tensor of `b` bit for bit.
void expect_same_tensors_bitwise(const std::string& a_dir, const std::string& b_dir, const Transformer& model) {
  const CheckpointReader a(a_dir), b(b_dir);
  EXPECT_EQ(a.tensor_names(), b.tensor_names()) << a_dir << " vs " << b_dir;
  for (const Parameter* p : model.parameters()) {
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq", ".master"}) {
      const std::string name = p->name + suffix;
      if (!a.has(name)) continue;
      Shape shape = p->grad.defined() ? p->grad.shape() : p->value.shape();
      const int64_t count = shape_numel(shape);
      std::vector<float> x(static_cast<size_t>(count)), y(x.size());
      const TensorLayout layout{name, shape, *suffix == '\0' && p->hf_transposed};
      a.read(layout, 0, count, x.data());
      b.read(layout, 0, count, y.data());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name << ": " << a_dir << " vs " << b_dir;
    }
  }
}

// The losses of `dir`/resumed (steps 5-8) equal `dir`/straight's steps 5-8 within `tolerance`.
void expect_resumed_losses_follow_straight(const std::string& dir, double tolerance) {
  const auto resumed = losses_of(dir + "/resumed/metrics.jsonl");
  const auto straight = losses_of(dir + "/straight/metrics.jsonl");
  ASSERT_EQ(straight.size(), static_cast<size_t>(kTotalSteps));
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kTotalSteps - kFirstSteps));
  for (size_t s = 0; s < resumed.size(); ++s)
    EXPECT_NEAR(resumed[s], straight[kFirstSteps + s], tolerance * straight[kFirstSteps + s])
        << "step " << kFirstSteps + s + 1;
}

class Resharding : public ::testing::TestWithParam<std::string> {};

TEST_P(Resharding, RoundTripIsBitwiseAndTrainingContinuesUnchanged) {
  const auto dp = world();
  if (dp->size() < 2 || kGlobalBatch % dp->size() != 0) GTEST_SKIP() << "needs 2 or 4 ranks";
  const int n = dp->size();
  const std::string root = shared_path("reshard_" + GetParam());
  TinyRun run("reshard");
  const std::string base = run.config("gpt2", kTotalSteps);
  auto config = [&](int ranks, int stage, const std::string& ckpt, const std::string& log) {
    TrainConfig c = parse(base, {"data.val=\"\"", "optim.eps=1e-6", "optim.lr=1e-3", "parallel.bucket_mb=0.002",
                                 "checkpoint.every=0", "checkpoint.keep_last=0", "train.precision=\"" + GetParam() + "\"",
                                 "parallel.zero_stage=" + std::to_string(stage),
                                 "train.batch_size=" + std::to_string(kGlobalBatch / ranks),
                                 "checkpoint.dir=\"" + root + "/" + ckpt + "\"", "log.dir=\"" + run.dir + "/" + log + "\""});
    return c;
  };

  // A: dp = N, ZeRO-3, the first 4 of 8 steps (the schedule spans 8); saved at step 4.
  TrainConfig first = config(n, 3, "a", "a");
  first.steps = kFirstSteps;
  Trainer(first, dp).run();
  // B: half the ranks (one process when N = 2) with ZeRO-1 load A and save it again.
  const int half = n / 2;
  const auto group = dp->split(dp->rank() < half ? 0 : 1, dp->rank(), "half");
  if (dp->rank() < half) {
    Trainer b(config(half, 1, "b", "b"), half > 1 ? group : nullptr);
    EXPECT_EQ(b.restore(root + "/a"), kFirstSteps);
    b.save(kFirstSteps);
  }
  dp->barrier();
  // C: one process loads B and saves the single-file format.
  if (dp->rank() == 0) {
    Trainer c(config(1, 0, "c", "c"));
    EXPECT_EQ(c.restore(root + "/b"), kFirstSteps);
    c.save(kFirstSteps);
  }
  dp->barrier();
  // D: back on dp = N ZeRO-3.
  {
    Trainer d(config(n, 3, "d", "d"), dp);
    EXPECT_EQ(d.restore(root + "/c"), kFirstSteps);
    d.save(kFirstSteps);
  }
  if (dp->rank() == 0) {
    const Transformer shapes(first.model);
    expect_same_tensors_bitwise(root + "/a", root + "/b", shapes);
    expect_same_tensors_bitwise(root + "/a", root + "/c", shapes);
    expect_same_tensors_bitwise(root + "/a", root + "/d", shapes);
    EXPECT_TRUE(CheckpointReader(root + "/a").sharded());
    EXPECT_EQ(CheckpointReader(root + "/a").world_size(), n);
    EXPECT_FALSE(CheckpointReader(root + "/c").sharded());
    // The sharded checkpoint exports to exactly the file one process writes.
    export_hf_checkpoint(root + "/a", root + "/hf", DType::F32);
    EXPECT_EQ(read_file_bytes(root + "/hf/model.safetensors"),
              read_file_bytes(root + "/c/" + checkpoint_dir_name(kFirstSteps) + "/model.safetensors"));
  }

  // Training resumed from D (steps 5-8) against one run of all 8 steps on the same layout.
  Trainer(config(n, 3, "d", "resumed"), dp).run();
  Trainer(config(n, 3, "straight", "straight"), dp).run();
  if (dp->rank() == 0) {
    expect_resumed_losses_follow_straight(run.dir, 1e-6);
    std::filesystem::remove_all(root);
  }
  dp->barrier();
}

// A run at dp = N stopped after 4 steps and resumed on half the ranks with twice the gradient
// accumulation (the same global batch) reads on exactly the sequences the uninterrupted dp = N
// run reads: the loader's position is kept in sequences, not in batches of one layout. Shuffled,
// so a wrong position would show as other data, not as a shifted copy of the same.
TEST(ReshardingData, ResumeOnHalfTheRanksReadsTheSequencesOfTheUninterruptedRun) {
  const auto dp = world();
  if (dp->size() < 2 || kGlobalBatch % dp->size() != 0) GTEST_SKIP() << "needs 2 or 4 ranks";
  const int n = dp->size(), half = n / 2;
  const std::string root = shared_path("reshard_data");
  TinyRun run("reshard_data");
  const std::string base = run.config("gpt2", kTotalSteps);
  auto config = [&](const std::string& name, int64_t grad_accum) {
    return parse(base, {"data.val=\"\"", "data.shuffle=true", "optim.lr=1e-3", "checkpoint.every=0",
                        "checkpoint.keep_last=0", "train.batch_size=" + std::to_string(kGlobalBatch / n),
                        "train.grad_accum=" + std::to_string(grad_accum),
                        "checkpoint.dir=\"" + root + "/" + name + "\"", "log.dir=\"" + run.dir + "/" + name + "\""});
  };
  TrainConfig first = config("first", 1);
  first.steps = kFirstSteps;
  Trainer(first, dp).run();
  Trainer(config("straight", 1), dp).run();
  const auto group = dp->split(dp->rank() < half ? 0 : 1, dp->rank(), "half");
  if (dp->rank() < half) {
    TrainConfig c = config("first", 2);
    c.run_dir = run.dir + "/resumed";
    c.resume = true;
    Trainer(c, half > 1 ? group : nullptr).run();  // resumes from the step-4 checkpoint
  }
  dp->barrier();
  if (dp->rank() == 0) {
    expect_resumed_losses_follow_straight(run.dir, 1e-5);
    std::filesystem::remove_all(root);
  }
  dp->barrier();
}

INSTANTIATE_TEST_SUITE_P(Precisions, Resharding, ::testing::Values("f32", "bf16"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace loom::test
