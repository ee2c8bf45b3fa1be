// One model on both devices: loom::Transformer moved onto CUDA (Transformer::to_device) against
// the same Transformer on the CPU, the reference. Nothing here is a GPU copy of the model: the
// modules, the stash, recomputation and the pipeline stages are the CPU's, computing through
// kernels/ops on device tensors.
// Tolerances:
//   - f32: the two devices differ only in summation order: the loss to 1e-5 relative, every
//     parameter gradient to 1e-4 of its tensor's largest element.
//   - bf16 storage (activations, their gradients and the working weights in bf16 on the GPU):
//     each stored value is the f32 one rounded once, 2^-9 relative. Through two tiny layers
//     that moves the loss (about ln 64 = 4.2) by far less than 1e-2 relative, the band the
//     issue sets for bf16; a path that lost the signal (zero gradients, unrounded garbage)
//     would fail the gradients' direction check (cosine > 0.99 with the f32 gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "../model_fixtures.hpp"
#include "gpu_test_support.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/model/transformer.hpp"

namespace loom::test {
namespace {

constexpr int64_t kBatch = 2, kSeq = 16;
constexpr uint64_t kSeed = 5;

using cuda::test::CudaTest;

// Every element within `tolerance` times the reference tensor's largest element (1 if all zero).
void expect_close_to_scale(const Tensor& got, const Tensor& want, double tolerance,
                           const std::string& what) {
  const std::vector<float> reference = want.to_f32_vector();
  const double scale = cuda::test::max_abs(reference);
  cuda::test::expect_close(got.to_f32_vector(), reference, 0.0,
                           tolerance * (scale > 0 ? scale : 1.0), what.c_str());
}

// The model at the test's seed, moved to `device` in `dtype` (the CPU: left where it is built).
std::unique_ptr<Transformer> model_on(const ModelConfig& c, Recompute recompute, Device device,
                                      DType dtype = DType::F32) {
  auto model = std::make_unique<Transformer>(c, recompute);
  model->init_weights(kSeed);
  if (device != Device::CPU) model->to_device(device, dtype);
  return model;
}

double cosine(const Tensor& a, const Tensor& b) {
  const auto x = a.to_f32_vector(), y = b.to_f32_vector();
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < x.size(); ++i)
    xy += double(x[i]) * y[i], xx += double(x[i]) * x[i], yy += double(y[i]) * y[i];
  return xy / std::sqrt(xx * yy);
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  explicit Batch(const ModelConfig& c)
      : tokens(random_tokens(kBatch * kSeq, c.vocab_size, 1)),
        targets(random_tokens(kBatch * kSeq, c.vocab_size, 2)) {}
};

double train_pass(Transformer& model, const Batch& batch) {
  model.zero_grad();
  const double loss = model.forward(batch.tokens.data(), batch.targets.data(), kBatch, kSeq,
                                    {true, 1.0f / (kBatch * kSeq)});
  model.backward();
  return loss;
}

struct Case {
  Architecture arch;
  Recompute recompute;
};

class ModelOnCuda : public CudaTest, public ::testing::WithParamInterface<Case> {
 protected:
  ModelConfig config() const {
    return GetParam().arch == Architecture::GPT2 ? tiny_gpt2() : tiny_llama();
  }
};

TEST_P(ModelOnCuda, F32MatchesTheCpuModel) {
  const ModelConfig c = config();
  const auto cpu_model = model_on(c, GetParam().recompute, Device::CPU);
  const auto gpu_model = model_on(c, GetParam().recompute, Device::CUDA);
  Transformer &cpu = *cpu_model, &gpu = *gpu_model;
  for (const Parameter* p : gpu.parameters()) {
    EXPECT_EQ(p->value.device(), Device::CUDA) << p->name;
    EXPECT_EQ(p->grad.device(), Device::CUDA) << p->name;
  }
  const Batch batch(c);
  for (int pass = 0; pass < 2; ++pass) {  // the second reuses every buffer the first made
    const double want = train_pass(cpu, batch), got = train_pass(gpu, batch);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "pass " << pass;
    for (size_t i = 0; i < cpu.parameters().size(); ++i)
      expect_close_to_scale(gpu.parameters()[i]->grad, cpu.parameters()[i]->grad, 1e-4,
                            cpu.parameters()[i]->name + ", pass " + std::to_string(pass));
  }
  const auto want = cpu.last_logits(batch.tokens.data(), kBatch, kSeq);
  const auto got = gpu.last_logits(batch.tokens.data(), kBatch, kSeq);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << "logit " << i;
}

TEST_P(ModelOnCuda, Bf16StorageHalvesActivationsAndKeepsTheGradients) {
  const ModelConfig c = config();
  const auto f32_model = model_on(c, GetParam().recompute, Device::CUDA, DType::F32);
  const auto bf16_model = model_on(c, GetParam().recompute, Device::CUDA, DType::BF16);
  Transformer &f32 = *f32_model, &bf16 = *bf16_model;
  for (const Parameter* p : bf16.parameters()) {
    EXPECT_EQ(p->value.dtype(), DType::BF16) << p->name << ": working weights are bf16";
    EXPECT_EQ(p->grad.dtype(), DType::F32) << p->name << ": gradients stay f32";
  }
  const Batch batch(c);
  auto activation_bytes = [] {
    return device_memory::stats(Device::CUDA).live_bytes[size_t(MemCategory::Activations)];
  };
  const int64_t before = activation_bytes();
  const double want = train_pass(f32, batch);
  const int64_t f32_bytes = activation_bytes() - before;
  const double got = train_pass(bf16, batch);
  const int64_t bf16_bytes = activation_bytes() - before - f32_bytes;
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want));
  // Half, plus the f32 norm statistics and log-sum-exps.
  EXPECT_GT(bf16_bytes, 0);
  EXPECT_LT(double(bf16_bytes), 0.6 * double(f32_bytes));
  for (size_t i = 0; i < f32.parameters().size(); ++i)
    EXPECT_GT(cosine(bf16.parameters()[i]->grad, f32.parameters()[i]->grad), 0.99)
        << f32.parameters()[i]->name;
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelOnCuda,
                         ::testing::Values(Case{Architecture::GPT2, Recompute::None},
                                           Case{Architecture::Llama, Recompute::None},
                                           Case{Architecture::GPT2, Recompute::Selective},
                                           Case{Architecture::Llama, Recompute::Full}),
                         [](const auto& info) {
                           return std::string(info.param.arch == Architecture::GPT2 ? "gpt2_"
                                                                                    : "llama_") +
                                  recompute_name(info.param.recompute);
                         });

// Heads wider than n_embd / n_head (16 against 8) and a 5-key sliding window on every other
// layer (the windowed layers through the ranged attention kernels), on CUDA against the CPU
// (f32, the tolerances of F32MatchesTheCpuModel), plain and under selective recomputation.
TEST_F(CudaTest, WideHeadsAndSlidingWindowsMatchTheCpuModel) {
  for (const Recompute recompute : {Recompute::None, Recompute::Selective}) {
    ModelConfig c = tiny_llama();
    c.attention_head_dim = 16;
    c.sliding_window = 5;
    c.global_attention_every = 2;
    const auto cpu_model = model_on(c, recompute, Device::CPU);
    const auto gpu_model = model_on(c, recompute, Device::CUDA);
    const Batch batch(c);
    const double want = train_pass(*cpu_model, batch), got = train_pass(*gpu_model, batch);
    const std::string what = std::string("recompute ") + recompute_name(recompute);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << what;
    for (size_t i = 0; i < cpu_model->parameters().size(); ++i)
      expect_close_to_scale(gpu_model->parameters()[i]->grad, cpu_model->parameters()[i]->grad,
                            1e-4, cpu_model->parameters()[i]->name + ", " + what);
  }
}

// Mixture-of-experts Llamas on CUDA against the CPU (f32): the rows gathered, run through each
// expert's GEMMs and combined on the device, routed on the host from the device's logits. A
// softmax router, dropless; and a sigmoid router with a capacity that drops slots, a shared
// expert and the z-loss, under full recomputation. Routing is discrete: logits that differ
// only in summation order (1e-7 relative) pick the same experts unless two scores tie to that
// precision; such a flip would show as a gradient error far above 1e-4 (read a failure with
// that in mind: the op-level test in test_cuda_moe.cpp isolates the row movement).
TEST_F(CudaTest, MixtureOfExpertsModelsMatchTheCpuModel) {
  for (const bool sigmoid : {false, true}) {
    ModelConfig c = tiny_llama();
    c.n_experts = 4;
    c.experts_per_token = 2;
    c.moe_aux_loss_coef = 0.01;
    if (sigmoid) {
      c.moe_router = MoeRouter::Sigmoid;
      c.moe_capacity_factor = 0.75;
      c.n_shared_experts = 1;
      c.moe_z_loss_coef = 1e-3;
    }
    const Recompute recompute = sigmoid ? Recompute::Full : Recompute::None;
    const auto cpu_model = model_on(c, recompute, Device::CPU);
    const auto gpu_model = model_on(c, recompute, Device::CUDA);
    const Batch batch(c);
    for (int pass = 0; pass < 2; ++pass) {
      const double want = train_pass(*cpu_model, batch), got = train_pass(*gpu_model, batch);
      const std::string what =
          std::string(sigmoid ? "sigmoid" : "softmax") + ", pass " + std::to_string(pass);
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << what;
      for (size_t i = 0; i < cpu_model->parameters().size(); ++i)
        expect_close_to_scale(gpu_model->parameters()[i]->grad, cpu_model->parameters()[i]->grad,
                              1e-4, cpu_model->parameters()[i]->name + ", " + what);
    }
  }
}

// The same dropless softmax MoE Llama with bf16 storage against itself in f32, both on CUDA:
// the bf16 path's conversions (bf16 logits to the host router, d_logits back) run, the loss
// stays within the bf16 band (1e-2), every gradient is finite, and the whole gradient keeps its
// direction (cosine of the concatenated gradients > 0.95: a token whose near-tied experts
// swap under bf16 moves it a little; zero or garbage gradients would not pass).
TEST_F(CudaTest, MixtureOfExpertsInBf16FollowsF32) {
  ModelConfig c = tiny_llama();
  c.n_experts = 4;
  c.experts_per_token = 2;
  const auto f32_model = model_on(c, Recompute::None, Device::CUDA, DType::F32);
  const auto bf16_model = model_on(c, Recompute::None, Device::CUDA, DType::BF16);
  const Batch batch(c);
  const double want = train_pass(*f32_model, batch), got = train_pass(*bf16_model, batch);
  EXPECT_NEAR(got, want, 1e-2 * std::abs(want));
  double xy = 0, xx = 0, yy = 0;
  for (size_t i = 0; i < f32_model->parameters().size(); ++i) {
    const auto a = f32_model->parameters()[i]->grad.to_f32_vector();
    const auto b = bf16_model->parameters()[i]->grad.to_f32_vector();
    for (size_t j = 0; j < a.size(); ++j) {
      ASSERT_TRUE(std::isfinite(b[j])) << bf16_model->parameters()[i]->name;
      xy += double(a[j]) * b[j], xx += double(a[j]) * a[j], yy += double(b[j]) * b[j];
    }
  }
  EXPECT_GT(xy / std::sqrt(xx * yy), 0.95);
}

// Two pipeline stages on the GPU, driven by hand (stage 0's output into stage 1, stage 1's
// input gradient back), against the whole model on the CPU: the stages' split, their activation
// sets and the hand-over between them run unchanged on the device.
TEST_F(CudaTest, PipelineStagesOnCudaGiveTheWholeCpuModelsLossAndGradients) {
  const ModelConfig c = tiny_llama();  // untied: no embedding copy to sum across stages
  Transformer whole(c);
  Transformer first(c, Recompute::None, kDefaultVocabChunk, nullptr, pipeline_chunks({1, 1}, 2, 0));
  Transformer last(c, Recompute::None, kDefaultVocabChunk, nullptr, pipeline_chunks({1, 1}, 2, 1));
  for (Transformer* m : {&whole, &first, &last}) m->init_weights(kSeed);
  first.to_device(Device::CUDA, DType::F32);
  last.to_device(Device::CUDA, DType::F32);
  const Batch batch(c);
  const float scale = 1.0f / (kBatch * kSeq);
  const double want =
      whole.forward(batch.tokens.data(), batch.targets.data(), kBatch, kSeq, {true, scale});
  whole.backward();

  ChunkActivations first_acts = first.make_activations(0, kBatch, kSeq);
  ChunkActivations last_acts = last.make_activations(0, kBatch, kSeq);
  EXPECT_EQ(first_acts.residuals.device(), Device::CUDA);
  first.forward_chunk(0, first_acts, batch.tokens.data(), nullptr, Tensor(), kBatch, kSeq,
                      {true, scale});
  const Tensor hand_over = first_acts.output();
  EXPECT_EQ(hand_over.device(), Device::CUDA);
  const double got = last.forward_chunk(0, last_acts, nullptr, batch.targets.data(), hand_over,
                                        kBatch, kSeq, {true, scale});
  const Tensor d_input = last.backward_chunk(0, last_acts, Tensor());
  ASSERT_TRUE(d_input.defined());
  EXPECT_FALSE(first.backward_chunk(0, first_acts, d_input).defined());
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want));

  std::map<std::string, const Parameter*> by_name;
  for (const Transformer* stage : {&first, &last})
    for (const Parameter* p : stage->parameters()) by_name[p->name] = p;
  ASSERT_EQ(by_name.size(), whole.parameters().size());
  for (const Parameter* p : whole.parameters())
    expect_close_to_scale(by_name.at(p->name)->grad, p->grad, 1e-4, p->name);
}

}  // namespace
}  // namespace loom::test
