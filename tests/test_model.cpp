// Model-level checks: every parameter's gradient against finite differences of the loss
// (GPT-2 and Llama), recomputation modes giving identical gradients with less activation
// memory, parameter counts, and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "gradcheck.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/model/flops.hpp"
#include "loom/model/parameter_specs.hpp"
#include "loom/model/transformer.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/train_config.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8;

class ModelGrad : public ::testing::TestWithParam<Architecture> {};

ModelConfig tiny(Architecture arch) { return arch == Architecture::GPT2 ? tiny_gpt2() : tiny_llama(); }

TEST_P(ModelGrad, EveryParameterMatchesFiniteDifferences) {
  Transformer model(tiny(GetParam()), Recompute::None, /*vocab_chunk=*/24);  // 3 chunks
  model.init_weights(1);
  // Larger weights than init so that every path carries a gradient well above f32 noise.
  for (Parameter* p : model.parameters())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] *= p->value.dim() == 2 ? 10.0f : 1.0f;
  const auto tokens = random_tokens(kBatch * kSeq, 64, 2), targets = random_tokens(kBatch * kSeq, 64, 3);
  model.zero_grad();
  model.forward(tokens.data(), targets.data(), kBatch, kSeq);
  model.backward();
  auto loss = [&] {
    return model.forward(tokens.data(), targets.data(), kBatch, kSeq, {false, 1.0f});
  };
  for (Parameter* p : model.parameters()) {
    std::vector<float> values = p->value.to_f32_vector();
    const std::vector<float> analytic = p->grad.to_f32_vector();
    // The checker perturbs a copy; mirror each perturbation into the model.
    float* live = p->value.f32();
    auto perturbed_loss = [&] {
      std::copy(values.begin(), values.end(), live);
      return loss();
    };
    const double error = max_gradient_error(values, analytic, perturbed_loss, 40);
    std::copy(values.begin(), values.end(), live);
    EXPECT_LT(error, kGradCheckTolerance) << p->name;  // step and tolerance: gradcheck.hpp
  }
}

TEST_P(ModelGrad, RecomputationGivesIdenticalGradientsWithLessMemory) {
  const auto tokens = random_tokens(kBatch * kSeq, 64, 4), targets = random_tokens(kBatch * kSeq, 64, 5);
  std::vector<std::vector<float>> grads[3];
  int64_t activation_bytes[3];
  const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int m = 0; m < 3; ++m) {
    const int64_t before = HostAllocator::instance().live_bytes(MemCategory::Activations);
    Transformer model(tiny(GetParam()), modes[m]);
    model.init_weights(6);
    model.zero_grad();
    model.forward(tokens.data(), targets.data(), kBatch, kSeq);
    model.backward();
    activation_bytes[m] = HostAllocator::instance().live_bytes(MemCategory::Activations) - before;
    for (Parameter* p : model.parameters()) grads[m].push_back(p->grad.to_f32_vector());
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  EXPECT_GT(activation_bytes[0], activation_bytes[1]);
  EXPECT_GT(activation_bytes[1], activation_bytes[2]);
}

TEST_P(ModelGrad, Bf16ActivationsAreRoundedAndRecomputationStaysExact) {
  const auto tokens = random_tokens(kBatch * kSeq, 64, 8), targets = random_tokens(kBatch * kSeq, 64, 9);
  std::vector<std::vector<float>> grads[3];
  double losses[3];
  const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int m = 0; m < 3; ++m) {
    Transformer model(tiny(GetParam()), modes[m]);
    model.init_weights(10);
    model.set_bf16_activations(true);
    model.zero_grad();
    losses[m] = model.forward(tokens.data(), targets.data(), kBatch, kSeq);
    model.backward();
    for (Parameter* p : model.parameters()) grads[m].push_back(p->grad.to_f32_vector());
  }
  // Recomputation reruns the same rounded forward, so gradients stay bitwise identical.
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  Transformer f32_model(tiny(GetParam()));
  f32_model.init_weights(10);
  const double f32_loss = f32_model.forward(tokens.data(), targets.data(), kBatch, kSeq, {false, 1.0f});
  EXPECT_NE(losses[0], f32_loss);                       // rounding happened
  EXPECT_NEAR(losses[0], f32_loss, 1e-2 * f32_loss);    // and stayed within bf16 precision
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelGrad, ::testing::Values(Architecture::GPT2, Architecture::Llama),
                         [](const auto& info) { return std::string(architecture_name(info.param)); });

// ForwardOptions::loss_sum: the forward returns 0, the loss waits in the sum (the same double
// the forward returns without it: the same kernels), and the gradients are unchanged, bit for
// bit. Both architectures, two forwards accumulating.
TEST_P(ModelGrad, ALossSumTakesTheLossAndLeavesTheGradients) {
  Transformer model(tiny(GetParam()), Recompute::None, /*vocab_chunk=*/24);
  model.init_weights(3);
  const auto tokens = random_tokens(kBatch * kSeq, 64, 6),
             targets = random_tokens(kBatch * kSeq, 64, 7);
  auto grads = [&] {
    std::vector<std::vector<float>> all;
    for (Parameter* p : model.parameters()) all.push_back(p->grad.to_f32_vector());
    return all;
  };
  model.zero_grad();
  const double returned = model.forward(tokens.data(), targets.data(), kBatch, kSeq);
  model.backward();
  const auto want = grads();
  ASSERT_GT(returned, 0.0);

  LossSum sum(Device::CPU);
  ForwardOptions options;
  options.loss_sum = &sum;
  model.zero_grad();
  EXPECT_EQ(model.forward(tokens.data(), targets.data(), kBatch, kSeq, options), 0.0);
  model.backward();
  EXPECT_EQ(sum.read(), returned);
  EXPECT_EQ(grads(), want);
  options.compute_grad = false;
  EXPECT_EQ(model.forward(tokens.data(), targets.data(), kBatch, kSeq, options), 0.0);
  EXPECT_EQ(sum.read(), returned + returned);
}

TEST(Model, ParameterSpecsDescribeTheBuiltModelInGradientReadyOrder) {
  for (const ModelConfig& config : {tiny_gpt2(), tiny_llama()}) {
    Transformer model(config);
    const ParameterList built = model.parameters_in_grad_ready_order();
    const std::vector<ParameterSpec> specs = parameter_specs(config);
    ASSERT_EQ(specs.size(), built.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, built[i]->name);
      EXPECT_EQ(specs[i].shape, built[i]->value.shape()) << specs[i].name;
      const ParameterList unit = model.unit_parameters(specs[i].unit);
      EXPECT_NE(std::find(unit.begin(), unit.end(), built[i]), unit.end()) << specs[i].name << " unit " << specs[i].unit;
    }
  }
}

TEST(Model, ParameterCountMatchesConfigAndAllocator) {
  ModelConfig wide_heads = tiny_llama();
  wide_heads.attention_head_dim = 12;  // 4 heads of 12: q and the attention output 48 wide, not 32
  for (const ModelConfig& config : {tiny_gpt2(), tiny_llama(), wide_heads}) {
    const int64_t before = HostAllocator::instance().live_bytes(MemCategory::Parameters);
    Transformer model(config);
    int64_t count = 0;
    for (const Parameter* p : model.parameters()) count += p->value.numel();
    EXPECT_EQ(count, config.parameter_count());
    EXPECT_EQ(HostAllocator::instance().live_bytes(MemCategory::Parameters) - before, count * 4);
  }
  EXPECT_NEAR(static_cast<double>(model_preset("gpt2-124m").parameter_count()), 124.44e6, 0.01e6);
  EXPECT_NEAR(static_cast<double>(model_preset("llama-8b").parameter_count()), 8.03e9, 0.01e9);
  // By hand for the wide heads: embeddings 64 x 32 and a head as large, 4096; per layer q and o
  // 2 x 32 x 48 = 3072, k and v 2 x 32 x 24 = 1536, MLP 3 x 32 x 48 = 4608, norms 64: 9280 x 2
  // layers; the final norm 32. 22,688.
  EXPECT_EQ(wide_heads.parameter_count(), 22688);
}

// Sliding-window attention's keys per query and FLOPs, by hand: 2 layers, a window of 4 on the
// first (global every 2nd), 10 tokens. Layer 0's queries see 1, 2, 3, then 4 keys seven times:
// 34 / 10 = 3.4 (= W - W(W - 1) / 2s, Megatron-Bridge's mean); layer 1's the causal 10 / 2 = 5.
TEST(Model, SlidingWindowKeysAndFlops) {
  ModelConfig c = tiny_llama();
  c.sliding_window = 4;
  c.global_attention_every = 2;
  EXPECT_TRUE(c.is_windowed_layer(0));
  EXPECT_FALSE(c.is_windowed_layer(1));
  EXPECT_EQ(c.windowed_layer_count(), 1);
  EXPECT_DOUBLE_EQ(c.mean_keys_per_query(0, 10), 3.4);
  EXPECT_DOUBLE_EQ(c.mean_keys_per_query(1, 10), 5.0);
  EXPECT_DOUBLE_EQ(c.mean_keys_per_query(0, 4), 2.0);  // a window as long as the sequence: causal
  ModelConfig global = c;
  global.sliding_window = global.global_attention_every = 0;
  // 12 FLOPs per key and attention column (2 matmuls x 2 x 3 for forward and backward), 32 columns.
  EXPECT_NEAR(flops_per_token(global, 10) - flops_per_token(c, 10), 12.0 * (5.0 - 3.4) * 32, 1e-6);
  c.global_attention_every = 0;
  EXPECT_EQ(c.windowed_layer_count(), 2);
  c.global_attention_every = 1;
  expect_contains(error_message([&] { c.validate(); }), {"model.global_attention_every", "G >= 2"});
  c.global_attention_every = 3;
  c.sliding_window = -1;
  expect_contains(error_message([&] { c.validate(); }), {"model.sliding_window", "-1"});
  c.sliding_window = 0;
  expect_contains(error_message([&] { c.validate(); }),
                  {"model.global_attention_every", "without model.sliding_window"});
  ModelConfig g = tiny_gpt2();
  g.sliding_window = 4;
  expect_contains(error_message([&] { g.validate(); }), {"model.sliding_window", "gpt2"});
  // Spelt in a config, the same model as its HF config reads back (so a checkpoint compares
  // equal): a window as long as the context is none; a global period past the last layer leaves
  // every layer windowed.
  auto parsed = [](const std::string& extra) {
    ConfigReader r = ConfigReader::from_string(
        "[model]\narch = \"llama\"\nn_layer = 2\nn_embd = 32\nn_head = 4\nmax_seq_len = 16\n" +
            extra,
        "t.toml");
    return parse_model_config(r);
  };
  EXPECT_EQ(parsed("sliding_window = 16\nglobal_attention_every = 2\n").sliding_window, 0);
  EXPECT_EQ(parsed("sliding_window = 8\nglobal_attention_every = 3\n").global_attention_every, 0);
  EXPECT_EQ(parsed("sliding_window = 8\nglobal_attention_every = 2\n").global_attention_every, 2);
}

// model.head_dim: refused on GPT-2, negative, or absent where n_head does not divide n_embd.
TEST(Model, HeadDimIsValidated) {
  ModelConfig c = tiny_llama();
  c.n_embd = 30;  // 4 heads do not divide it
  expect_contains(error_message([&] { c.validate(); }), {"model.n_head", "model.head_dim"});
  c.attention_head_dim = 8;
  EXPECT_NO_THROW(c.validate());
  c.attention_head_dim = -8;
  expect_contains(error_message([&] { c.validate(); }), {"model.head_dim", "-8"});
  c.attention_head_dim = 7;
  expect_contains(error_message([&] { c.validate(); }), {"even", "RoPE"});
  ModelConfig g = tiny_gpt2();
  g.attention_head_dim = 16;
  expect_contains(error_message([&] { g.validate(); }), {"model.head_dim", "GPT-2"});
}

// Mixture of experts: the counts follow the published totals, the specs add up to them, the
// engine builds a Llama-style MoE model with exactly those parameters (Mixtral's names), and
// says it cannot build GPT-2-style experts.
TEST(Model, MixtureOfExpertsCountsSpecsAndActiveFlops) {
  const ModelConfig mixtral = model_preset("mixtral-8x7b");
  EXPECT_NEAR(static_cast<double>(mixtral.parameter_count()), 46.70e9, 0.01e9);  // Jiang et al. 2024: 46.7B
  // 12.9B active: 2 of the 8 experts per layer; the input embedding is a lookup, not a matmul.
  EXPECT_NEAR(flops_per_token(mixtral, 0) / 6 + 32000.0 * 4096, 12.9e9, 0.05e9);
  for (ModelConfig config : {tiny_gpt2(), tiny_llama()}) {
    config.n_experts = 4;
    config.experts_per_token = 2;
    int64_t total = 0, expert = 0;
    for (const ParameterSpec& spec : parameter_specs(config)) {
      total += spec.numel();
      if (spec.expert) expert += spec.numel();
    }
    EXPECT_EQ(total, config.parameter_count());
    EXPECT_EQ(expert, config.n_layer * 4 * config.expert_parameter_count());
    if (config.arch == Architecture::GPT2) {
      expect_contains(error_message([&] { Transformer model(config); }), {"n_experts = 4", "Llama-style"});
    } else {  // the engine builds exactly the parameters the specs list
      const int64_t before = HostAllocator::instance().live_bytes(MemCategory::Parameters);
      Transformer model(config);
      EXPECT_EQ(HostAllocator::instance().live_bytes(MemCategory::Parameters) - before, 4 * total);
      std::vector<std::string> names, spec_names;
      for (const Parameter* p : model.parameters()) names.push_back(p->name);
      for (const ParameterSpec& spec : parameter_specs(config)) spec_names.push_back(spec.name);
      std::sort(names.begin(), names.end());
      std::sort(spec_names.begin(), spec_names.end());
      EXPECT_EQ(names, spec_names);
    }
    config.experts_per_token = 5;
    expect_contains(error_message([&] { config.validate(); }), {"experts_per_token: got 5, expected 1 to model.n_experts = 4"});
  }
  // DeepSeek-V3's shape (DeepSeek-AI 2024, Table/appendix config): 61 layers, the first 3
  // dense (ffn 18432), 256 routed experts of 2048 + 1 shared, 8 per token, hidden 7168. Its
  // MLA attention is not loom's, so only the feed-forward counts are checked, by hand:
  // per MoE layer 257 x 3 x 7168 x 2048 + the 256 x 7168 router; per dense layer 3 x 7168 x 18432.
  ModelConfig v3 = tiny_llama();
  v3.n_layer = 61;
  v3.n_embd = 7168;
  v3.n_head = v3.n_kv_head = 56;
  v3.ffn_hidden = 18432;
  v3.n_experts = 256;
  v3.experts_per_token = 8;
  v3.n_shared_experts = 1;
  v3.moe_ffn_hidden = 2048;
  v3.moe_first_dense = 3;
  EXPECT_EQ(v3.moe_layer_count(), 58);
  const int64_t moe_ffn = 257LL * 3 * 7168 * 2048 + 256LL * 7168, dense_ffn = 3LL * 7168 * 18432;
  const int64_t attention_and_rest = v3.parameter_count() - 58 * moe_ffn - 3 * dense_ffn;
  ModelConfig dense = v3;
  dense.n_experts = dense.experts_per_token = dense.n_shared_experts = dense.moe_ffn_hidden = dense.moe_first_dense = 0;
  EXPECT_EQ(attention_and_rest, dense.parameter_count() - 61 * dense_ffn);
  // Active: 8 routed + 1 shared expert and the router in the 58 MoE layers.
  EXPECT_DOUBLE_EQ(flops_per_token(v3, 0) - flops_per_token(dense, 0),
                   6.0 * static_cast<double>(58 * (9LL * 3 * 7168 * 2048 + 256LL * 7168) - 58 * dense_ffn));
  // The preset: DeepSeek-V3 reports 671B parameters, 37B activated per token (technical report,
  // abstract). Full attention (4 x 7168^2 per layer) in place of MLA (about 0.19B per layer)
  // adds about 1.1B: by hand 672.1B in all, 37.7B in the matmuls a token meets.
  const ModelConfig preset = model_preset("deepseek-v3-gqa");
  EXPECT_NEAR(static_cast<double>(preset.parameter_count()), 671e9, 0.01 * 671e9);
  EXPECT_NEAR(flops_per_token(preset, 0) / 6, 37e9, 0.03 * 37e9);
  const ModelConfig small = model_preset("deepseek-v3-small");
  EXPECT_EQ(small.moe_layer_count(), 3);
  EXPECT_NO_THROW(small.validate());
  // Layer kinds reach the specs and the engine: a tiny model with a dense first layer.
  ModelConfig mixed = tiny_llama();
  mixed.n_experts = 4;
  mixed.experts_per_token = 2;
  mixed.moe_ffn_hidden = 12;
  mixed.moe_first_dense = 1;
  const Transformer model(mixed);
  EXPECT_TRUE(model.blocks[0]->mlp && !model.blocks[0]->moe);
  EXPECT_TRUE(model.blocks[1]->moe && !model.blocks[1]->mlp);
  EXPECT_EQ(model.blocks[1]->moe->gate[0].value.shape(), (Shape{12, mixed.n_embd}));
  int64_t specs = 0;
  for (const ParameterSpec& spec : parameter_specs(mixed)) specs += spec.numel();
  EXPECT_EQ(specs, mixed.parameter_count());
  mixed.moe_first_dense = 2;
  expect_contains(error_message([&] { mixed.validate(); }), {"model.moe_first_dense: got 2", "at least one layer"});
  mixed.moe_first_dense = 0;
  mixed.moe_every = 0;
  expect_contains(error_message([&] { mixed.validate(); }), {"model.moe_every: got 0"});
}

// Packed documents (set_document_mask): one sequence of three documents gives the summed loss
// and every parameter's gradient of the three documents run one by one. With positions
// restarting per document that holds for GPT-2's learned positions too; without, for Llama only
// (RoPE scores see relative positions, so a document's offset changes nothing but rounding).
struct PackedCase {
  Architecture arch;
  bool restart_positions;
  int64_t window = 0;  // a sliding window of that many keys on the first layer of two
};
class PackedDocuments : public ::testing::TestWithParam<PackedCase> {};

TEST_P(PackedDocuments, EqualTheirDocumentsAlone) {
  const auto [arch, restart, window] = GetParam();
  constexpr int32_t kEot = 3;
  constexpr int64_t kLength = 16;
  const std::vector<int64_t> starts = {0, 5, 12, kLength};  // documents of 5, 7 and 4 tokens
  std::vector<int32_t> tokens = random_tokens(kLength, 64, 30);
  for (int32_t& t : tokens)
    if (t == kEot) t = kEot + 1;
  tokens[4] = tokens[11] = kEot;  // the first two documents end with the end token
  const std::vector<int32_t> targets = random_tokens(kLength, 64, 31);

  ModelConfig config = tiny(arch);
  config.sliding_window = window;
  config.global_attention_every = window > 0 ? 2 : 0;
  Transformer packed(config);
  packed.init_weights(32);
  packed.set_document_mask(kEot, restart);
  EXPECT_EQ(packed.restarts_positions(), restart);
  packed.zero_grad();
  const double packed_loss = packed.forward(tokens.data(), targets.data(), 1, kLength);
  packed.backward();

  Transformer alone(config);
  alone.init_weights(32);
  alone.zero_grad();
  double alone_loss = 0;
  for (size_t d = 0; d + 1 < starts.size(); ++d) {
    const int64_t first = starts[d], length = starts[d + 1] - first;
    alone_loss += alone.forward(tokens.data() + first, targets.data() + first, 1, length);
    alone.backward();  // gradients accumulate over the documents
  }
  EXPECT_NEAR(packed_loss, alone_loss, 1e-5 * alone_loss);
  for (size_t i = 0; i < packed.parameters().size(); ++i) {
    const std::vector<float> got = packed.parameters()[i]->grad.to_f32_vector();
    const std::vector<float> want = alone.parameters()[i]->grad.to_f32_vector();
    float scale = 0;
    for (float g : want) scale = std::max(scale, std::fabs(g));
    for (size_t k = 0; k < want.size(); ++k)
      ASSERT_NEAR(got[k], want[k], 1e-5f * scale) << packed.parameters()[i]->name << " [" << k << "]";
  }
  // Without the mask the later documents see the earlier ones: the test can fail.
  Transformer unmasked(config);
  unmasked.init_weights(32);
  EXPECT_GT(std::fabs(unmasked.forward(tokens.data(), targets.data(), 1, kLength, {false, 1.0f}) - alone_loss),
            1e-3);
  if (config.sliding_window == 0) return;
  // The window bites (the 7-token document is longer than it): without it the loss differs.
  ModelConfig global = config;
  global.sliding_window = global.global_attention_every = 0;
  Transformer unwindowed(global);
  unwindowed.init_weights(32);
  unwindowed.set_document_mask(kEot, restart);
  EXPECT_GT(std::fabs(unwindowed.forward(tokens.data(), targets.data(), 1, kLength, {false, 1.0f}) -
                      alone_loss),
            1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PackedDocuments,
    ::testing::Values(PackedCase{Architecture::Llama, false}, PackedCase{Architecture::Llama, true},
                      PackedCase{Architecture::GPT2, true},
                      PackedCase{Architecture::Llama, true, 4}),
    [](const auto& info) {
      return std::string(info.param.arch == Architecture::GPT2 ? "gpt2" : "llama") +
             (info.param.restart_positions ? "_restarting_positions" : "") +
             (info.param.window > 0 ? "_window" + std::to_string(info.param.window) : "");
    });

// Positions that do not restart: GPT-2's later documents sit at other position rows than they
// would alone, so the sum differs (what document_positions is for).
TEST(Model, Gpt2PackedDocumentsNeedRestartingPositions) {
  std::vector<int32_t> tokens = random_tokens(16, 64, 30);
  for (int32_t& t : tokens) t = t == 3 ? 4 : t;
  tokens[4] = 3;
  const std::vector<int32_t> targets = random_tokens(16, 64, 31);
  Transformer restarting(tiny_gpt2()), fixed(tiny_gpt2());
  restarting.init_weights(32);
  fixed.init_weights(32);
  restarting.set_document_mask(3, true);
  fixed.set_document_mask(3, false);
  EXPECT_GT(std::fabs(restarting.forward(tokens.data(), targets.data(), 1, 16, {false, 1.0f}) -
                      fixed.forward(tokens.data(), targets.data(), 1, 16, {false, 1.0f})),
            1e-3);
}

// GPT-2 (learned positions) with the mask: the loss of the second document's tokens (the first
// one's targets ignored) does not depend on what the first document says; without the mask it
// does. Bad end tokens are refused.
TEST(Model, DocumentMaskHidesEarlierDocuments) {
  constexpr int32_t kEot = 0;
  std::vector<int32_t> tokens = random_tokens(kSeq, 64, 33);
  for (int32_t& t : tokens) t = t == kEot ? 1 : t;
  tokens[3] = kEot;  // document one: positions 0-3
  std::vector<int32_t> targets = random_tokens(kSeq, 64, 34);
  for (int i = 0; i <= 3; ++i) targets[static_cast<size_t>(i)] = -1;
  std::vector<int32_t> changed = tokens;
  changed[0] = (changed[0] + 7) % 64 == kEot ? 9 : (changed[0] + 7) % 64;
  changed[2] = (changed[2] + 5) % 64 == kEot ? 9 : (changed[2] + 5) % 64;
  Transformer model(tiny_gpt2());
  model.init_weights(35);
  auto loss = [&](const std::vector<int32_t>& t) {
    return model.forward(t.data(), targets.data(), 1, kSeq, {false, 1.0f});
  };
  EXPECT_GT(std::fabs(loss(tokens) - loss(changed)), 1e-4);
  model.set_document_mask(kEot);
  EXPECT_EQ(model.document_mask_token(), kEot);
  EXPECT_EQ(loss(tokens), loss(changed));
  expect_contains(error_message([&] { model.set_document_mask(64); }),
                  {"end-of-document token 64", "[0, 64)"});
  // The ranges themselves: each token's document up to itself, the end token closing its own.
  const std::vector<int32_t> two_docs = {5, 0, 6, 7};
  EXPECT_EQ(Transformer::document_key_ranges(two_docs.data(), 1, 4, 0),
            (std::vector<int32_t>{0, 1, 0, 2, 2, 3, 2, 4}));
}

TEST(Model, RejectsBadInputs) {
  Transformer model(tiny_gpt2());
  std::vector<int32_t> tokens(kBatch * kSeq, 1);
  tokens[3] = 64;
  EXPECT_THROW(model.forward(tokens.data(), tokens.data(), kBatch, kSeq), Error);
  std::vector<int32_t> long_seq(17, 1);
  EXPECT_THROW(model.forward(long_seq.data(), long_seq.data(), 1, 17), Error);
  ModelConfig bad = tiny_llama();
  bad.n_kv_head = 3;
  EXPECT_THROW(bad.validate(), Error);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

// What a device cannot hold is refused before anything moves: the CPU computes in f32 (bf16 is
// emulated by rounding there), and CUDA needs a device. The model stays usable on the CPU.
TEST(Model, ToDeviceRefusesWhatTheDeviceCannotHold) {
  Transformer model(tiny_gpt2());
  model.init_weights(1);
  expect_contains(error_message([&] { model.to_device(Device::CPU, DType::BF16); }),
                  {"CPU computes in f32", "bf16 storage is for CUDA"});
  if (device_memory::cuda_device_count() == 0)
    expect_contains(error_message([&] { model.to_device(Device::CUDA, DType::F32); }), {"cuda"});
  EXPECT_EQ(model.device(), Device::CPU);
  EXPECT_EQ(model.parameters()[0]->value.device(), Device::CPU);
  std::vector<int32_t> tokens(kBatch * kSeq, 1);
  EXPECT_TRUE(std::isfinite(model.forward(tokens.data(), tokens.data(), kBatch, kSeq)));
}

}  // namespace
}  // namespace loom::test
