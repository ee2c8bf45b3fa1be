// Parity with an independent PyTorch implementation (tests/torch_ref, Debian's python3-torch):
// loom writes initial weights, a batch, its loss and gradients, and its weights after 10
// AdamW steps; check_parity.py recomputes all of it and compares (loss 1e-5 relative,
// gradients and trained weights 1e-4 relative).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/model/transformer.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/grad_clip.hpp"
#include "model_fixtures.hpp"

namespace loom::test {
namespace {

SafetensorsEntry int_entry(const std::string& name, const std::vector<int32_t>& values, Shape shape) {
  SafetensorsEntry e{name, "I32", std::move(shape), {}};
  e.bytes.resize(values.size() * sizeof(int32_t));
  std::memcpy(e.bytes.data(), values.data(), e.bytes.size());
  return e;
}

void write_parity_dump(const std::string& dir, const ModelConfig& config) {
  std::filesystem::create_directories(dir);
  constexpr int64_t kBatch = 3, kSeq = 12, kSteps = 10;
  Transformer model(config, Recompute::None, /*vocab_chunk=*/20);
  model.init_weights(42);
  const auto tokens = random_tokens(kBatch * kSeq, config.vocab_size, 1);
  const auto targets = random_tokens(kBatch * kSeq, config.vocab_size, 2);
  std::ofstream(dir + "/config.json") << hf_config_json(config).dump(2);
  write_safetensors(dir + "/model.safetensors", export_hf_weights(model.parameters(), DType::F32));
  write_safetensors(dir + "/batch.safetensors",
                    {int_entry("inputs", tokens, {kBatch, kSeq}), int_entry("targets", targets, {kBatch, kSeq})});

  const float grad_scale = 1.0f / (kBatch * kSeq);
  auto step_grads = [&] {
    model.zero_grad();
    model.reset_moe_totals();
    const double loss = model.forward(tokens.data(), targets.data(), kBatch, kSeq, {true, grad_scale});
    model.backward();
    return loss * grad_scale + model.moe_totals().loss;  // a MoE model's objective adds its router losses
  };
  const double loss = step_grads();
  ParameterList params = model.parameters();
  std::vector<SafetensorsEntry> grads;
  for (Parameter* p : params) {
    // Export gradients through the same HF mapping as weights (transposes included).
    Parameter view = *p;
    view.value = p->grad;
    ParameterList one{&view};
    grads.push_back(export_hf_weights(one, DType::F32).front());
  }
  Tensor loss_tensor = Tensor::empty({1}, DType::F32, MemCategory::Workspace);
  loss_tensor.f32()[0] = static_cast<float>(loss);
  grads.push_back(entry_from_tensor("loss", loss_tensor));
  write_safetensors(dir + "/grads.safetensors", grads);

  const AdamWConfig adamw{0.9, 0.95, 1e-8, 0.1};
  const double lr = 1e-3, clip = 0.5;  // clip low enough to be active on this model
  AdamW optimizer(params, adamw);
  for (int64_t s = 0; s < kSteps; ++s) {
    if (s > 0) step_grads();
    clip_grad_norm(params, clip);
    optimizer.update(lr);
  }
  write_safetensors(dir + "/trained.safetensors", export_hf_weights(params, DType::F32));
  nlohmann::json train = {{"steps", kSteps}, {"lr", lr}, {"beta1", adamw.beta1}, {"beta2", adamw.beta2},
                          {"eps", adamw.eps}, {"weight_decay", adamw.weight_decay}, {"grad_clip", clip}};
  train["decay_params"] = nlohmann::json::array();
  for (Parameter* p : params)
    if (p->weight_decay) train["decay_params"].push_back(p->name);
  std::ofstream(dir + "/train.json") << train.dump(2);
}

int run_checker(const std::string& dir) {
  const std::string command = "OMP_NUM_THREADS=1 /usr/bin/python3 " LOOM_SOURCE_DIR
                              "/tests/torch_ref/check_parity.py " + dir;
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Dumps `config`'s run into a temporary directory named after `label`, has check_parity.py
// recompute it, and removes the directory.
void expect_parity(const ModelConfig& config, const std::string& label) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / (label + "_" + std::to_string(::getpid())))
          .string();
  write_parity_dump(dir, config);
  EXPECT_EQ(run_checker(dir), 0) << "check_parity.py found a mismatch in " << dir;
  std::filesystem::remove_all(dir);
}

class ParityWithPyTorch : public ::testing::TestWithParam<Architecture> {};

TEST_P(ParityWithPyTorch, LossGradientsAndTenAdamWSteps) {
  const ModelConfig config = GetParam() == Architecture::GPT2 ? tiny_gpt2() : tiny_llama();
  expect_parity(config, "loom_parity_" + std::string(architecture_name(config.arch)));
}

INSTANTIATE_TEST_SUITE_P(Archs, ParityWithPyTorch, ::testing::Values(Architecture::GPT2, Architecture::Llama),
                         [](const auto& info) { return std::string(architecture_name(info.param)); });

// Heads wider and narrower than n_embd / n_head (HF's head_dim: Qwen3, Mistral NeMo): q and the
// attention output are n_head x head_dim wide, 48 and 16 here against a 32-wide stream, and the
// softmax scale is 1/sqrt(head_dim).
class HeadDimParityWithPyTorch : public ::testing::TestWithParam<int64_t> {};

TEST_P(HeadDimParityWithPyTorch, LossGradientsAndTenAdamWSteps) {
  ModelConfig config = tiny_llama();
  config.attention_head_dim = GetParam();
  ASSERT_NE(config.q_dim(), config.n_embd);
  expect_parity(config, "loom_parity_head_dim_" + std::to_string(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Widths, HeadDimParityWithPyTorch,
                         ::testing::Values(int64_t{12}, int64_t{4}));

// Sliding-window attention (written as a Mistral config, with layer_types when some layers are
// global), against models.py's banded mask: a window of 5 keys on sequences of 12, on every
// layer and on the first of two (gpt-oss's and Gemma 2's pattern), and with wide heads.
struct WindowCase {
  int64_t window, global_every, head_dim;
  const char* label;
};
class SlidingWindowParityWithPyTorch : public ::testing::TestWithParam<WindowCase> {};

TEST_P(SlidingWindowParityWithPyTorch, LossGradientsAndTenAdamWSteps) {
  ModelConfig config = tiny_llama();
  config.sliding_window = GetParam().window;
  config.global_attention_every = GetParam().global_every;
  config.attention_head_dim = GetParam().head_dim;
  expect_parity(config, "loom_parity_window_" + std::string(GetParam().label));
}

INSTANTIATE_TEST_SUITE_P(Windows, SlidingWindowParityWithPyTorch,
                         ::testing::Values(WindowCase{5, 0, 0, "every_layer"},
                                           WindowCase{5, 2, 12, "alternating_wide_heads"}),
                         [](const auto& info) { return std::string(info.param.label); });

// A tiny Mixtral (Llama attention, 4 SwiGLU experts per block, 2 per token) with its balancing
// and z losses in the objective: softmax routing dropless (Mixtral's), the sigmoid router with a
// capacity that drops slots, and with a shared expert (DeepSeekMoE), against models.py's
// MixtralSparseMoeBlock; and DeepSeek's shapes: fine-grained experts (half the dense width)
// with a dense first layer, and an expert layer followed by a dense one (moe_every = 2).
struct MoeParityCase {
  MoeRouter router;
  double capacity_factor;
  const char* label;
  int64_t shared_experts = 0;
  int64_t moe_ffn_hidden = 0, first_dense = 0, every = 1;
};
class MoeParityWithPyTorch : public ::testing::TestWithParam<MoeParityCase> {};

TEST_P(MoeParityWithPyTorch, LossGradientsAndTenAdamWSteps) {
  ModelConfig config = tiny_llama();
  config.n_experts = 4;
  config.experts_per_token = 2;
  config.ffn_hidden = 24;
  config.moe_aux_loss_coef = 0.05;
  config.moe_z_loss_coef = 0.01;
  config.moe_router = GetParam().router;
  config.moe_capacity_factor = GetParam().capacity_factor;
  config.n_shared_experts = GetParam().shared_experts;
  config.moe_ffn_hidden = GetParam().moe_ffn_hidden;
  config.moe_first_dense = GetParam().first_dense;
  config.moe_every = GetParam().every;
  expect_parity(config, "loom_parity_moe_" + std::string(GetParam().label));
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeParityWithPyTorch,
                         ::testing::Values(MoeParityCase{MoeRouter::Softmax, 0.0, "softmax"},
                                           MoeParityCase{MoeRouter::Sigmoid, 0.75, "sigmoid_capacity"},
                                           MoeParityCase{MoeRouter::Sigmoid, 0.0, "sigmoid_shared", 1},
                                           MoeParityCase{MoeRouter::Sigmoid, 0.0, "fine_grained_first_dense", 1, 12, 1},
                                           MoeParityCase{MoeRouter::Softmax, 0.0, "moe_then_dense", 0, 12, 0, 2}),
                         [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace loom::test
