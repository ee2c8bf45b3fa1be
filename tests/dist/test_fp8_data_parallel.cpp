// FP8 training under data parallelism against one process on the same global batch (plain dp
// and ZeRO-1, each recipe). Every replica must quantise as one process would: the amaxes of
// the per-tensor recipes are reduced (max) over the replicas, so all use the scale of the whole
// global batch (Transformer Engine's amax reduction group); blockwise tiles never span rows, so
// a replica's rows get the scales they get in one process. With the reduction switched off
// (checked by mutation) the current recipe's first loss already misses by ~1e-3.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"

namespace loom::test {
namespace {

struct Fp8Case {
  std::string recipe;
  int zero_stage;
  int64_t grad_accum;
};

class Fp8DataParallelParity : public ::testing::TestWithParam<Fp8Case> {};

// Tolerance. The two runs sum gradients in a different order, so their f32 weights differ in the
// last bits (the f32 test holds them to 1e-5 of the largest weight) and so do the amaxes and
// activations computed from them. A quantised operand then differs only where such a difference
// carries an element across a rounding midpoint: with E4M3's grid 2^-3 relative apart, a
// perturbation of ~1e-6 relative does so for about 1e-6 / 2^-3 ~ 1e-5 of the elements, and each
// such element moves by one grid step (<= 2^-3 of itself). A GEMM output is a sum over ~32-128
// products, so it moves by about 2^-3 x 1e-5 x sqrt(fraction) ~ 1e-6 to 1e-5 relative; through
// ten steps of AdamW at lr 1e-3 that stays within 1e-4 of the loss and 1e-4 of the weights, ten
// times the f32 test's bounds. (An unreduced amax is ~1e-3 off at the first step.)
TEST_P(Fp8DataParallelParity, LossesAndWeightsMatchOneProcess) {
  const auto dp = world();
  if (kGlobalBatch % dp->size() != 0)
    GTEST_SKIP() << "global batch 8 does not split over " << dp->size();
  const Fp8Case c = GetParam();
  TinyRun run("fp8_dp_" + c.recipe);
  const std::string base = run.config("gpt2", kSteps);
  const std::vector<std::string> common = {"checkpoint.dir=\"\"",
                                           "data.val=\"\"",
                                           "train.grad_accum=" + std::to_string(c.grad_accum),
                                           "parallel.zero_stage=" + std::to_string(c.zero_stage),
                                           "parallel.bucket_mb=0.002",
                                           "optim.eps=1e-5",
                                           "optim.lr=1e-3",
                                           "train.precision=\"fp8\"",
                                           "train.fp8_recipe=\"" + c.recipe + "\""};
  auto with = [&](std::vector<std::string> extra) { return plus(std::move(extra), common); };
  Trainer reference(parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch),
                                      "log.dir=\"" + run.dir + "/ref\""})));
  reference.run();
  Trainer parallel(
      parse(base, with({"train.batch_size=" + std::to_string(kGlobalBatch / dp->size()),
                        "log.dir=\"" + run.dir + "/dp\""})),
      dp);
  parallel.run();
  constexpr double kTolerance = 1e-4;
  if (dp->rank() == 0)
    expect_losses_follow(run.dir + "/ref/metrics.jsonl", run.dir + "/dp/metrics.jsonl", kTolerance);
  const ParameterList& ref_params = reference.model().parameters();
  const ParameterList& dp_params = parallel.model().parameters();
  for (size_t i = 0; i < ref_params.size(); ++i)
    EXPECT_LE(relative_weight_difference(ref_params[i]->value.to_f32_vector(),
                                         dp_params[i]->value.to_f32_vector()),
              kTolerance)
        << ref_params[i]->name << " on rank " << dp->rank();
  // Every replica keeps the same amax history as one process (to the f32 noise above).
  const std::vector<float> ref_history = reference.model().fp8()->amax_history();
  const std::vector<float> dp_history = parallel.model().fp8()->amax_history();
  ASSERT_EQ(ref_history.size(), dp_history.size());
  for (size_t k = 0; k < ref_history.size(); ++k)
    EXPECT_NEAR(dp_history[k], ref_history[k], kTolerance * std::fabs(ref_history[k]))
        << "amax " << k;
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8DataParallelParity,
                         ::testing::Values(Fp8Case{"delayed", 0, 1}, Fp8Case{"current", 0, 1},
                                           Fp8Case{"blockwise", 0, 1}, Fp8Case{"delayed", 1, 2},
                                           Fp8Case{"current", 1, 1}, Fp8Case{"blockwise", 1, 1}),
                         [](const auto& info) {
                           return info.param.recipe + "_zero" +
                                  std::to_string(info.param.zero_stage) + "_accum" +
                                  std::to_string(info.param.grad_accum);
                         });

}  // namespace
}  // namespace loom::test
