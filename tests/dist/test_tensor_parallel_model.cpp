// Tensor- and sequence-parallel models against one process. Every rank builds the
// single-process model and the same model through a TensorParallelPlan over its tp group, both
// initialised from one seed, and trains both for 10 plain-SGD steps on the same tokens: the
// first loss must agree to 1e-6, every loss to 1e-5, every gradient of the first step and every
// final weight (this rank's shard of the reference's) to 1e-5. Layouts: tp = world size, and
// dp = 2 x tp = 2 at 4 ranks; with and without sequence parallelism; GPT-2 (tied embeddings,
// learned positions, biases) and Llama (GQA, RoPE, SwiGLU, untied head), each under two
// recomputation modes; a vocabulary of 61, which no tp > 1 divides, so the uneven vocabulary
// split is exercised everywhere.
#include <gtest/gtest.h>

#include <cmath>

#include "../model_fixtures.hpp"
#include "dist_fixture.hpp"
#include "loom/core/allocator.hpp"
#include "loom/dist/device_mesh.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/transformer.hpp"
#include "loom/parallel/tensor_parallel_plan.hpp"
#include "loom/plan/memory_model.hpp"

namespace loom::test {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8, kParitySteps = 10;
constexpr float kLearningRate = 0.5f;

ModelConfig tp_gpt2() {
  ModelConfig c = tiny_gpt2();
  c.vocab_size = 61;
  c.ffn_hidden = 64;
  return c;
}

ModelConfig tp_llama() {
  ModelConfig c = tiny_llama();
  c.vocab_size = 61;
  c.n_head = 8;
  c.n_kv_head = 4;  // grouped: two query heads per kv head, on every tp rank
  return c;
}

struct Case {
  std::string arch;
  Recompute recompute;
};

std::vector<std::shared_ptr<ProcessGroup>> tp_groups(const std::shared_ptr<ProcessGroup>& world) {
  std::vector<MeshShape> shapes = {MeshShape{.tp = world->size()}};
  if (world->size() == 4) shapes.push_back(MeshShape{.dp = 2, .tp = 2});
  std::vector<std::shared_ptr<ProcessGroup>> out;
  for (const MeshShape& shape : shapes) out.push_back(DeviceMesh(world, shape).group({"tp"}));
  return out;
}

void sgd_step(Transformer& model) {
  for (Parameter* p : model.parameters()) {
    float* v = p->value.f32();
    const float* g = p->grad.f32();
    for (int64_t i = 0; i < p->value.numel(); ++i) v[i] -= kLearningRate * g[i];
  }
  model.zero_grad();
}

class TensorParallelModel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelModel, TrainsLikeOneProcess) {
  const Case c = GetParam();
  ModelConfig config = c.arch == "gpt2" ? tp_gpt2() : tp_llama();
  if (c.arch == "llama_wide_heads")
    config.attention_head_dim = 6;  // 8 heads of 6: q 48 wide on a 32 stream
  const auto tokens = random_tokens(kBatch * kSeq + 1, config.vocab_size, 11);
  const int32_t* inputs = tokens.data();
  const int32_t* targets = tokens.data() + 1;
  for (const auto& tp : tp_groups(world())) {
    for (const bool sp : {false, true}) {
      const std::string what = c.arch + " tp=" + std::to_string(tp->size()) + (sp ? " +sp" : "") +
                               " recompute=" + recompute_name(c.recompute);
      Transformer reference(config, c.recompute, 16);
      reference.init_weights(7);
      Transformer parallel(config, c.recompute, 16, std::make_shared<TensorParallelPlan>(tp, sp));
      parallel.init_weights(7);
      const ParameterList& ref = reference.parameters();
      const ParameterList& par = parallel.parameters();
      ASSERT_EQ(ref.size(), par.size());
      for (int64_t step = 0; step < kParitySteps; ++step) {
        const double ref_loss = reference.forward(inputs, targets, kBatch, kSeq, {true, 0.01f});
        const double par_loss = parallel.forward(inputs, targets, kBatch, kSeq, {true, 0.01f});
        const double tolerance = step == 0 ? 1e-6 : 1e-5;
        EXPECT_NEAR(par_loss, ref_loss, tolerance * ref_loss) << what << " step " << step + 1;
        reference.backward();
        parallel.backward();
        if (step == 0) {
          for (size_t i = 0; i < ref.size(); ++i) {
            EXPECT_LE(shard_difference(ref[i]->grad, par[i]->placement, par[i]->grad), 1e-5)
                << what << ": gradient of " << ref[i]->name;
          }
        }
        sgd_step(reference);
        sgd_step(parallel);
      }
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_EQ(ref[i]->name, par[i]->name);
        EXPECT_LE(shard_difference(ref[i]->value, par[i]->placement, par[i]->value), 1e-5)
            << what << ": final " << ref[i]->name;
      }
      // Generation reads the whole vocabulary's logits, gathered from the shards.
      const std::vector<float> ref_logits = reference.last_logits(inputs, kBatch, kSeq);
      const std::vector<float> par_logits = parallel.last_logits(inputs, kBatch, kSeq);
      EXPECT_LE(relative_weight_difference(ref_logits, par_logits), 1e-5) << what << ": logits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, TensorParallelModel,
    ::testing::Values(Case{"gpt2", Recompute::None}, Case{"gpt2", Recompute::Full},
                      Case{"llama", Recompute::None}, Case{"llama", Recompute::Selective},
                      Case{"llama_wide_heads", Recompute::Selective}),
    [](const auto& info) { return info.param.arch + "_" + recompute_name(info.param.recompute); });

// Parameters, gradients and activations per rank: every sharded tensor holds its 1/tp
// (the vocabulary its ceil(V/tp) block), and sequence parallelism divides the rest of the
// activations by tp too; the bytes the allocator counts equal the planner's engine figures.
TEST(TensorParallelModelMemory, BytesPerRankMatchTheShardsAndThePlanner) {
  const auto world_group = world();
  for (const auto& tp : tp_groups(world_group)) {
    for (const ModelConfig& config : {tp_gpt2(), tp_llama()}) {
      for (const bool sp : {false, true}) {
        const std::string what = std::string(architecture_name(config.arch)) +
                                 " tp=" + std::to_string(tp->size()) + (sp ? " +sp" : "");
        const MemStats before = HostAllocator::instance().stats();
        Transformer model(config, Recompute::None, 16, std::make_shared<TensorParallelPlan>(tp, sp));
        const auto tokens = random_tokens(kBatch * kSeq, config.vocab_size, 3);
        model.forward(tokens.data(), tokens.data(), kBatch, kSeq, {true, 1.0f});
        const MemStats after = HostAllocator::instance().stats();
        auto live = [&](MemCategory category) {
          const auto i = static_cast<size_t>(category);
          return static_cast<double>(after.live_bytes[i] - before.live_bytes[i]);
        };
        // Expected from the parameter list's placement (the planner's source): linear weights
        // (and column-parallel biases) divide by tp, the vocabulary tables take their block,
        // norms, row-parallel biases and the position table stay whole.
        const int t = tp->size(), r = tp->rank();
        double expected = 0;
        for (const ParameterSpec& spec : parameter_specs(config))
          expected += static_cast<double>(spec.numel_on_tp_rank(t, r));
        EXPECT_EQ(live(MemCategory::Parameters), 4 * expected) << what;
        EXPECT_EQ(live(MemCategory::Gradients), 4 * expected) << what;
        const plan::MemoryBreakdown predicted = plan::predict_engine_memory(
            config, 1, 0, 25'000'000, false, kBatch, kSeq, Recompute::None, t, sp);
        EXPECT_EQ(live(MemCategory::Activations), predicted.activations) << what;
      }
    }
  }
}

// The model checks its plan's split before allocating anything; no communication is needed
// to fail, so a plan that only claims four ranks stands in for the group.
TEST(TensorParallelModelErrors, ATpThatDoesNotDivideTheHeadsIsNamed) {
  struct FourRanks final : ParallelPlan {
    int tp() const override { return 4; }
  };
  ModelConfig config = tp_llama();
  config.n_kv_head = 2;  // 8 query heads divide by 4, 2 kv heads do not
  expect_contains(error_message([&] {
                    Transformer model(config, Recompute::None, 16, std::make_shared<FourRanks>());
                  }),
                  {"model.n_kv_head = 2", "tp = 4"});
}

}  // namespace
}  // namespace loom::test
