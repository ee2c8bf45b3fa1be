// FP8 training of mixture-of-experts layers (MoeLayer::enable_fp8): every expert's gate, up
// and down GEMMs on FP8 operands with scales of their own, the shared experts' too, the router
// in f32. Per expert scales: an expert whose weights are 2^10 times larger leaves every other
// expert's output bit for bit as it was (one scale for all experts would quantise their weights
// 2^10 times more coarsely); an expert no token chose still runs (its operands quantised, no
// rows) and gets no gradient; a Llama with experts learns the Markov stream in FP8 and tracks
// f32 within the E4M3 band of test_fp8_training.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>

#include "gradcheck.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/moe.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/trainer.hpp"
#include "moe_fixtures.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

std::shared_ptr<Fp8Context> current_scaling() {
  auto context = std::make_shared<Fp8Context>();
  context->config.recipe = Fp8Recipe::Current;
  return context;
}

// The rows of the routed order that expert `e` ran (s.offsets: one process's experts in order).
std::vector<float> rows_of(const MoeStash& s, int64_t e) {
  const Tensor rows = s.expert_out.narrow_rows(s.offsets[static_cast<size_t>(e)],
                                               s.offsets[static_cast<size_t>(e) + 1]);
  return rows.to_f32_vector();
}

// Delayed scaling: the second step quantises each operand with its own history's scale, so an
// expert shares nothing with the others (with one scaling state for all experts, checked by
// mutation, every expert's history would hold the loud expert's amaxes and this fails).
TEST(Fp8Moe, EachExpertScalesItsOwnOperands) {
  const MoeSpec spec{.dim = 16, .experts = 4, .top_k = 2, .ffn_hidden = 8, .shared_experts = 1};
  MoeLayer plain(spec, "moe"), loud(spec, "moe"), f32(spec, "moe");
  for (MoeLayer* layer : {&plain, &loud, &f32}) fill_layer(*layer, 3);
  for (Parameter* p : {&loud.gate[0], &loud.up[0], &loud.down[0]})  // exact: a power of two
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] *= 1024.0f;
  std::vector<std::unique_ptr<Fp8Training>> training;
  for (MoeLayer* layer : {&plain, &loud}) {
    auto experts = std::make_shared<Fp8Context>(), shared = std::make_shared<Fp8Context>();
    const MoeLayer::Fp8Layers fp8 = layer->enable_fp8(experts, shared);
    EXPECT_EQ(fp8.experts.size(), 12u);  // gate, up, down of each of the 4 experts
    EXPECT_EQ(fp8.shared.size(), 3u);
    training.push_back(std::make_unique<Fp8Training>(
        std::vector<Fp8LayerGroup>{{experts, fp8.experts, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
                                   {shared, fp8.shared, {12, 13, 14}}},
        15));
  }
  const int64_t rows = 12;
  const Tensor x = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
  const std::vector<float> xv = random_vector(rows * 16, 5);
  std::copy(xv.begin(), xv.end(), x.f32());
  MoeStash s_plain, s_loud, s_f32;
  const Tensor out = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
  for (int step = 0; step < 2; ++step) {  // the first step's amaxes become the second's scales
    for (auto& t : training) t->begin_step();
    plain.forward(out, x, s_plain);
    loud.forward(out, x, s_loud);
    for (auto& t : training) t->finish_step(true);
  }
  f32.forward(out, x, s_f32);
  ASSERT_EQ(s_plain.selected, s_loud.selected) << "the router is the same";
  ASSERT_GT(s_plain.offsets[1], 0) << "expert 0 runs some rows";
  for (int64_t e = 1; e < spec.experts; ++e) {
    ASSERT_GT(s_plain.offsets[static_cast<size_t>(e) + 1], s_plain.offsets[static_cast<size_t>(e)]);
    EXPECT_EQ(rows_of(s_loud, e), rows_of(s_plain, e)) << "expert " << e;
    // Quantised: not f32's numbers (so the equality above is not f32 arithmetic's).
    EXPECT_NE(rows_of(s_plain, e), rows_of(s_f32, e)) << "expert " << e;
  }
  EXPECT_NE(rows_of(s_loud, 0), rows_of(s_plain, 0));
  // The shared experts (the dense context) do not see expert 0's scale either.
  EXPECT_EQ(s_loud.shared_act.to_f32_vector(), s_plain.shared_act.to_f32_vector());
}

TEST(Fp8Moe, AnExpertWithoutTokensQuantisesAndGetsNoGradient) {
  // 2 rows x top 2 reach at most 4 of 8 experts.
  const MoeSpec spec{.dim = 16, .experts = 8, .top_k = 2, .ffn_hidden = 8, .shared_experts = 1};
  MoeLayer layer(spec, "moe");
  fill_layer(layer, 11);
  auto experts = current_scaling();
  const MoeLayer::Fp8Layers fp8 = layer.enable_fp8(experts, current_scaling());
  std::vector<int64_t> slots(fp8.experts.size());
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  Fp8Training training({Fp8LayerGroup{experts, fp8.experts, slots}},
                       static_cast<int64_t>(slots.size()));
  // The reductions the experts' group makes (the trainer's all-reduce over the ranks holding
  // them): the same with idle experts as with every expert busy, or ranks of one group whose
  // tokens differ would issue different collectives. By hand, current scaling: per projection
  // 2 forward (input, weight) + 3 backward (gradient, weight for d_input; input for d_weight),
  // 3 projections x 8 experts, and the step's one: 121.
  int64_t reductions = 0;
  experts->reduce_max = [&](std::span<float>) { ++reductions; };
  auto pass = [&](int64_t rows, uint64_t seed) {
    const Tensor in = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
    const std::vector<float> v = random_vector(static_cast<size_t>(rows * 16), seed);
    std::copy(v.begin(), v.end(), in.f32());
    MoeStash stash;
    const Tensor y = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
    const Tensor dy = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
    std::copy(v.begin(), v.end(), dy.f32());
    const Tensor dx = Tensor::empty({rows, 16}, DType::F32, MemCategory::Workspace);
    reductions = 0;
    training.begin_step();
    layer.forward(y, in, stash);
    layer.backward(dx, dy, in, stash, 0.0f, 0.0f);
    training.finish_step(false);
    int64_t busy = 0;
    for (int64_t e = 0; e < spec.experts; ++e)
      busy += stash.offsets[static_cast<size_t>(e) + 1] > stash.offsets[static_cast<size_t>(e)];
    return std::make_pair(reductions, busy);
  };
  const auto [all_busy_reductions, all_busy] = pass(64, 21);
  const auto [some_idle_reductions, some_busy] = pass(2, 22);
  EXPECT_EQ(all_busy, 8);
  EXPECT_LE(some_busy, 4);
  EXPECT_EQ(all_busy_reductions, 121);
  EXPECT_EQ(some_idle_reductions, 121);
  experts->reduce_max = nullptr;
  ParameterList params;
  layer.collect(params);
  for (Parameter* p : params) p->grad.zero_();

  training.begin_step();
  const Tensor x = Tensor::empty({2, 16}, DType::F32, MemCategory::Workspace);
  const std::vector<float> xv = random_vector(32, 6);
  std::copy(xv.begin(), xv.end(), x.f32());
  MoeStash s;
  const Tensor out = Tensor::empty({2, 16}, DType::F32, MemCategory::Workspace);
  layer.forward(out, x, s);
  const Tensor d_out = Tensor::empty({2, 16}, DType::F32, MemCategory::Workspace);
  const std::vector<float> dv = random_vector(32, 7);
  std::copy(dv.begin(), dv.end(), d_out.f32());
  const Tensor d_x = Tensor::empty({2, 16}, DType::F32, MemCategory::Workspace);
  layer.backward(d_x, d_out, x, s, 0.0f, 0.0f);
  training.finish_step(true);
  int64_t idle = 0;
  for (int64_t e = 0; e < spec.experts; ++e) {
    const bool ran = s.offsets[static_cast<size_t>(e) + 1] > s.offsets[static_cast<size_t>(e)];
    idle += !ran;
    for (const Parameter* p :
         {&layer.gate[static_cast<size_t>(e)], &layer.up[static_cast<size_t>(e)],
          &layer.down[static_cast<size_t>(e)]}) {
      double norm = 0;
      for (float g : p->grad.to_f32_vector()) norm += std::fabs(g);
      EXPECT_EQ(norm > 0, ran) << p->name;
    }
    // Every expert's weight was quantised, with or without rows: its step amax is in the
    // history (an idle expert's input and gradient amaxes are 0).
    const std::vector<float> history = training.amax_history();
    const size_t per = kDefaultFp8AmaxHistory;
    EXPECT_GT(history[(3 * static_cast<size_t>(e) * 3 + 1) * per], 0.0f)
        << "expert " << e << "'s gate weight";
    EXPECT_EQ(history[(3 * static_cast<size_t>(e) * 3) * per] > 0.0f, ran)
        << "expert " << e << "'s gate input";
  }
  EXPECT_GE(idle, 4);
}

// The E4M3 band of test_fp8_training.cpp: K = 8 n_layer roundings in series (a block's four
// GEMMs: q|k|v, attention output, the experts' gate|up and down), rho = sqrt(K) 2^-5, the loss
// within rho ln V of f32's.
class Fp8MoeRecipes : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8MoeRecipes, ExpertsLearnAndTrackF32WithinE4M3Precision) {
  TinyRun run("fp8_moe_" + GetParam());
  run.write_learnable_shards();
  const std::string base = run.config("llama", kLearnableSteps);
  auto run_with = [&](const std::string& name, std::vector<std::string> overrides) {
    overrides.insert(
        overrides.end(),
        {kLearnableLr, "model.n_experts=4", "model.experts_per_token=2", "model.n_shared_experts=1",
         "log.dir=\"" + run.dir + "/" + name + "\"", "checkpoint.dir=\"\""});
    ConfigReader reader = ConfigReader::from_string(base, "test.toml");
    reader.apply_overrides(overrides);
    Trainer trainer(parse_train_config(reader));
    const TrainSummary summary = trainer.run();
    return std::make_pair(summary, losses_of(run.dir + "/" + name + "/metrics.jsonl"));
  };
  const auto [f32, f32_losses] = run_with("f32", {});
  const auto [fp8, fp8_losses] =
      run_with("fp8", {"train.precision=\"fp8\"", "train.fp8_recipe=\"" + GetParam() + "\""});
  ASSERT_EQ(fp8_losses.size(), f32_losses.size());
  const double initial_loss = std::log(64.0);
  EXPECT_LT(fp8.last_train_loss, 0.45 * initial_loss);                            // learns
  const double band = std::sqrt(8.0 * 2) * std::ldexp(1.0, -5) * std::log(64.0);  // 2 layers
  double gap = 0;
  for (size_t s = 0; s < f32_losses.size(); ++s)
    gap = std::max(gap, std::fabs(f32_losses[s] - fp8_losses[s]));
  EXPECT_LT(gap, band);
  EXPECT_GT(gap, 1e-4) << "the experts' GEMMs ran on FP8 operands";
  std::printf("fp8 MoE %s: largest gap to f32 %.4f nats (band %.3f); final %.4f vs f32 %.4f\n",
              GetParam().c_str(), gap, band, fp8.last_train_loss, f32.last_train_loss);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8MoeRecipes,
                         ::testing::Values("delayed", "current", "blockwise"));

}  // namespace
}  // namespace loom::test
