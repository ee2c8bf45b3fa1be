// The mixture-of-experts layer (model/moe): routing by hand for both routers, capacity
// dropping by hand, finite-difference gradients of output, balancing loss and z-loss, an
// independent PyTorch reference (tests/torch_ref/check_moe_layer.py, float64), the selection
// bias update, and bad specs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gradcheck.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/moe.hpp"
#include "moe_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

Tensor host(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  std::copy(values.begin(), values.end(), t.f32());
  return t;
}

// Softmax over [1, 3, 2, 0]: the top two are experts 1 and 2, weighted e^3 : e^2, i.e.
// 1 / (1 + e^-1) and 1 / (1 + e). A row of equal logits goes to the lowest indices, 1/2 each.
// Sigmoid over [0, 0, 1, -1] with bias [0, 0.5, 0, 0]: the bias lifts expert 1 (0.5 + 0.5)
// over expert 2 (sigmoid(1) = 0.731) and expert 0, so experts 1 and 2 are chosen, weighted by
// their unbiased scores 0.5 : 0.731.
TEST(MoeRouting, SoftmaxAndSigmoidTopKByHand) {
  const std::vector<float> logits = {1, 3, 2, 0, 0, 0, 0, 0};
  std::vector<float> probs(8), weights(4);
  std::vector<int32_t> selected(4);
  std::vector<int64_t> counts(4);
  cpu::moe_route({2, 4, 2, false}, logits.data(), nullptr, probs.data(), selected.data(), weights.data(),
                 counts.data());
  EXPECT_EQ(selected, (std::vector<int32_t>{1, 2, 0, 1}));
  EXPECT_NEAR(weights[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(weights[1], 1 / (1 + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(weights[2], 0.5, 1e-7);
  EXPECT_NEAR(weights[3], 0.5, 1e-7);
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 2, 1, 0}));
  // aux = E sum_i f_i P_i with f = counts / 2 and P the mean softmax probability.
  const double z0 = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  const double p0[4] = {std::exp(1.0) / z0, std::exp(3.0) / z0, std::exp(2.0) / z0, 1.0 / z0};
  double aux = 0;
  for (int e = 0; e < 4; ++e) aux += 4.0 * (counts[static_cast<size_t>(e)] / 2.0) * ((p0[e] + 0.25) / 2.0);
  const double z = (std::log(z0) * std::log(z0) + std::log(4.0) * std::log(4.0)) / 2.0;
  const cpu::MoeRouterLosses losses = cpu::moe_router_losses({2, 4, 2, false}, logits.data(), probs.data(), counts.data());
  EXPECT_NEAR(losses.aux, aux, 1e-6);
  EXPECT_NEAR(losses.z, z, 1e-6);

  const std::vector<float> sig_logits = {0, 0, 1, -1}, bias = {0, 0.5f, 0, 0};
  cpu::moe_route({1, 4, 2, true}, sig_logits.data(), bias.data(), probs.data(), selected.data(), weights.data(),
                 counts.data());
  const double s2 = 1 / (1 + std::exp(-1.0));
  EXPECT_EQ(selected[0], 1);
  EXPECT_EQ(selected[1], 2);
  EXPECT_NEAR(weights[0], 0.5 / (0.5 + s2), 1e-6);
  EXPECT_NEAR(weights[1], s2 / (0.5 + s2), 1e-6);
}

// Four tokens all routed to experts 0 and 1 (the router sees only the first input column), at
// capacity factor 1: ceil(1 x 2 x 4 / 4) = 2 rows per expert, so both keep tokens 0 and 1 and
// tokens 2 and 3 lose both slots: their output is zero, the first two tokens' is whole.
TEST(MoeLayer, CapacityDropsTheLaterTokensOfAnOverloadedExpert) {
  MoeSpec spec{.dim = 4, .experts = 4, .top_k = 2, .ffn_hidden = 3, .capacity_factor = 1.0};
  MoeLayer layer(spec, "moe");
  fill_layer(layer, 5);
  std::fill(layer.router.value.f32(), layer.router.value.f32() + 16, 0.0f);
  layer.router.value.f32()[0] = 2.0f;  // expert 0: 2 x0
  layer.router.value.f32()[4] = 1.0f;  // expert 1: x0
  const Tensor x = host({4, 4}, {1, 0.5f, -1, 2, 2, 1, 0, -1, 1.5f, -0.5f, 1, 0, 3, 0, 2, 1});
  const Tensor out = Tensor::empty({4, 4}, DType::F32, MemCategory::Workspace);
  MoeStash stash;
  layer.forward(out, x, stash);
  const std::vector<int64_t> routed = {4, 4, 0, 0};
  EXPECT_EQ(stash.counts, routed);
  EXPECT_EQ(stash.dropped, 4);
  EXPECT_EQ(stash.position, (std::vector<int32_t>{0, 2, 1, 3, -1, -1, -1, -1}));
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out.f32()[8 + j], 0.0f);
    EXPECT_EQ(out.f32()[12 + j], 0.0f);
  }
  // Dropless, the same tokens keep every slot and the first two outputs are unchanged.
  MoeLayer dropless({.dim = 4, .experts = 4, .top_k = 2, .ffn_hidden = 3}, "moe");
  ParameterList a, b;
  layer.collect(a);
  dropless.collect(b);
  for (size_t i = 0; i < a.size(); ++i) std::copy(a[i]->value.f32(), a[i]->value.f32() + a[i]->value.numel(), b[i]->value.f32());
  const Tensor whole = Tensor::empty({4, 4}, DType::F32, MemCategory::Workspace);
  MoeStash all;
  dropless.forward(whole, x, all);
  EXPECT_EQ(all.dropped, 0);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(whole.f32()[j], out.f32()[j]);
  EXPECT_NE(whole.f32()[12], 0.0f);
}

// CPU mixed precision: what the layer keeps for backward holds bf16 values (rounding them again
// changes nothing), the router's logits stay f32, and the output differs from the f32 layer's
// by the roundings alone: each stored tensor moves by at most 2^-9 relative, and the output
// (a few roundings deep) stays within a few of those of the f32 one.
TEST(MoeLayer, Bf16ActivationsAreStoredAsBf16Values) {
  const MoeSpec spec{.dim = 8, .experts = 4, .top_k = 2, .ffn_hidden = 6, .shared_experts = 1};
  MoeLayer f32(spec, "moe"), bf16(spec, "moe");
  fill_layer(f32, 7);
  fill_layer(bf16, 7);
  bf16.set_bf16_activations(true);
  const Tensor x = host({5, 8}, random_vector(40, 9));
  ops::round_to_bf16_(x);  // the norm's output arrives in bf16 values
  const Tensor out32 = Tensor::empty({5, 8}, DType::F32, MemCategory::Workspace);
  const Tensor out16 = Tensor::empty({5, 8}, DType::F32, MemCategory::Workspace);
  MoeStash s32, s16;
  f32.forward(out32, x, s32);
  bf16.forward(out16, x, s16);
  auto is_bf16 = [](const Tensor& t) {
    const std::vector<float> before = t.to_f32_vector();
    const Tensor copy = Tensor::empty(t.shape(), DType::F32, MemCategory::Workspace);
    copy.copy_from(t);
    ops::round_to_bf16_(copy);
    return copy.to_f32_vector() == before;
  };
  for (const Tensor* t : {&s16.pre, &s16.act, &s16.expert_out, &s16.shared_pre, &s16.shared_act})
    EXPECT_TRUE(is_bf16(*t));
  EXPECT_FALSE(is_bf16(s32.pre)) << "the f32 layer keeps f32 values (else the check above proves nothing)";
  EXPECT_FALSE(is_bf16(s16.logits)) << "the router stays f32";
  EXPECT_EQ(s16.selected, s32.selected);
  double scale = 0, diff = 0;
  for (int64_t i = 0; i < 40; ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(out32.f32()[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(out32.f32()[i] - out16.f32()[i])));
  }
  EXPECT_GT(diff, 0.0);
  EXPECT_LE(diff, 8 * std::ldexp(1.0, -9) * scale);
}

struct MoeCase {
  MoeRouter router;
  double capacity_factor;
  const char* label;
  int64_t shared_experts = 0;
};

class MoeLayerCases : public ::testing::TestWithParam<MoeCase> {};

// L = sum(out . probe) + 0.7 aux + 0.3 z, against central differences. Top-k selection is
// piecewise constant: the check asserts every token's k-th and (k+1)-th selection scores are
// further apart than a step can move them, so no difference crosses a switch.
TEST_P(MoeLayerCases, GradientsMatchFiniteDifferences) {
  const MoeCase c = GetParam();
  constexpr int64_t rows = 6, dim = 5, experts = 4, k = 2, ffn = 3;
  MoeLayer layer({dim, experts, k, ffn, c.shared_experts, c.router, c.capacity_factor}, "moe");
  fill_layer(layer, 17);
  if (c.router == MoeRouter::Sigmoid) layer.update_bias({3, 0, 6, 3}, 0.05f);  // bias [0, 0.05, -0.05, 0]
  std::vector<float> xv = random_vector(rows * dim, 7);
  const std::vector<float> probe = random_vector(rows * dim, 4);
  constexpr float aux_scale = 0.7f, z_scale = 0.3f;
  auto loss = [&] {
    const Tensor x = host({rows, dim}, xv), out = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
    MoeStash s;
    layer.forward(out, x, s);
    std::vector<float> o(out.f32(), out.f32() + rows * dim);
    return dot(o, probe) + aux_scale * s.losses.aux + z_scale * s.losses.z;
  };
  const Tensor x = host({rows, dim}, xv), out = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
  MoeStash s;
  layer.forward(out, x, s);
  // Selection margins: the k-th minus the (k+1)-th score of every row.
  double margin = 1e9;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> score(s.probs.f32() + r * experts, s.probs.f32() + (r + 1) * experts);
    for (int64_t e = 0; e < experts; ++e) score[static_cast<size_t>(e)] += layer.bias()[static_cast<size_t>(e)];
    std::sort(score.begin(), score.end(), std::greater<>());
    margin = std::min(margin, static_cast<double>(score[k - 1] - score[k]));
  }
  // One perturbed element moves a row's logits by at most step x max(|x|, |W_router|), and a
  // softmax probability or sigmoid score by at most a quarter of that: two scores' gap by half.
  double largest = 0;
  for (float v : xv) largest = std::max(largest, static_cast<double>(std::fabs(v)));
  for (int64_t i = 0; i < layer.router.value.numel(); ++i)
    largest = std::max(largest, static_cast<double>(std::fabs(layer.router.value.f32()[i])));
  ASSERT_GT(margin, 0.5 * kGradCheckStep * largest) << "a selection this close can flip under a finite-difference step";
  if (c.capacity_factor > 0) {
    EXPECT_GT(s.dropped, 0) << "the capacity case should drop something";
  }
  const Tensor d_x = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
  ParameterList params;
  layer.collect(params);
  for (Parameter* p : params) p->grad.zero_();
  layer.backward(d_x, host({rows, dim}, probe), x, s, aux_scale, z_scale);
  EXPECT_LT(max_gradient_error(xv, std::vector<float>(d_x.f32(), d_x.f32() + rows * dim), loss),
            kGradCheckTolerance)
      << "d_x";
  for (Parameter* p : params) {
    std::vector<float> value(p->value.f32(), p->value.f32() + p->value.numel());
    const std::vector<float> grad(p->grad.f32(), p->grad.f32() + p->grad.numel());
    auto param_loss = [&] {
      std::copy(value.begin(), value.end(), p->value.f32());
      return loss();
    };
    EXPECT_LT(max_gradient_error(value, grad, param_loss), kGradCheckTolerance) << p->name;
    std::copy(value.begin(), value.end(), p->value.f32());
  }
}

// The same layer against check_moe_layer.py's float64 PyTorch reference.
TEST_P(MoeLayerCases, MatchesPyTorch) {
  const MoeCase c = GetParam();
  constexpr int64_t rows = 12, dim = 8, experts = 4, k = 2, ffn = 6;
  MoeLayer layer({dim, experts, k, ffn, c.shared_experts, c.router, c.capacity_factor}, "moe");
  fill_layer(layer, 23);
  if (c.router == MoeRouter::Sigmoid) layer.update_bias({1, 9, 4, 2}, 0.1f);  // bias [0.1, -0.1, 0, 0.1]
  const Tensor x = host({rows, dim}, random_vector(rows * dim, 5));
  const Tensor probe = host({rows, dim}, random_vector(rows * dim, 6));
  const Tensor out = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
  const Tensor d_x = Tensor::empty({rows, dim}, DType::F32, MemCategory::Workspace);
  constexpr float aux_scale = 0.5f, z_scale = 0.25f;
  MoeStash s;
  layer.forward(out, x, s);
  ParameterList params;
  layer.collect(params);
  for (Parameter* p : params) p->grad.zero_();
  layer.backward(d_x, probe, x, s, aux_scale, z_scale);
  if (c.capacity_factor > 0) {
    EXPECT_GT(s.dropped, 0);
  }

  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("loom_moe_" + std::string(c.label) + "_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/moe.json") << nlohmann::json{{"router", moe_router_name(c.router)},
                                                     {"top_k", k},
                                                     {"capacity_factor", c.capacity_factor},
                                                     {"aux_scale", aux_scale},
                                                     {"z_scale", z_scale}}
                                          .dump();
  const Tensor bias = host({experts}, layer.bias());
  std::vector<SafetensorsEntry> inputs = {entry_from_tensor("x", x), entry_from_tensor("probe", probe),
                                          entry_from_tensor("bias", bias)};
  std::vector<SafetensorsEntry> results = {entry_from_tensor("out", out), entry_from_tensor("d_x", d_x),
                                           entry_from_tensor("aux", host({1}, {static_cast<float>(s.losses.aux)})),
                                           entry_from_tensor("z", host({1}, {static_cast<float>(s.losses.z)}))};
  for (Parameter* p : params) {
    const std::string name = p->name.substr(4);  // drop "moe."
    inputs.push_back(entry_from_tensor(name, p->value));
    results.push_back(entry_from_tensor(name, p->grad));
  }
  write_safetensors(dir + "/inputs.safetensors", inputs);
  write_safetensors(dir + "/loom.safetensors", results);
  const std::string command =
      "OMP_NUM_THREADS=1 /usr/bin/python3 " LOOM_SOURCE_DIR "/tests/torch_ref/check_moe_layer.py " + dir;
  const int status = std::system(command.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0) << "check_moe_layer.py found a mismatch in " << dir;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeLayerCases,
                         ::testing::Values(MoeCase{MoeRouter::Softmax, 0.0, "softmax"},
                                           MoeCase{MoeRouter::Sigmoid, 0.0, "sigmoid_bias"},
                                           MoeCase{MoeRouter::Softmax, 0.75, "softmax_capacity"},
                                           MoeCase{MoeRouter::Softmax, 0.0, "softmax_shared", 1}),
                         [](const auto& info) { return std::string(info.param.label); });

// DeepSeek-V3's bias update: experts above the mean load lose `rate`, below gain it; the
// softmax router has no selection bias to update.
TEST(MoeLayer, BiasFollowsTheLoadAndBadSpecsAreRefused) {
  MoeLayer layer({.dim = 2, .experts = 4, .top_k = 1, .ffn_hidden = 2, .router = MoeRouter::Sigmoid}, "moe");
  layer.update_bias({5, 1, 3, 3}, 0.01f);
  EXPECT_EQ(layer.bias(), (std::vector<float>{-0.01f, 0.01f, 0.0f, 0.0f}));
  MoeLayer softmax({.dim = 2, .experts = 4, .top_k = 1, .ffn_hidden = 2}, "moe");
  expect_contains(error_message([&] { softmax.update_bias({1, 1, 1, 1}, 0.01f); }), {"sigmoid router", "softmax"});
  expect_contains(error_message([&] { MoeLayer bad({.dim = 2, .experts = 4, .top_k = 5, .ffn_hidden = 2}, "m"); }),
                  {"experts_per_token = 5", "1 to model.n_experts = 4"});
  expect_contains(error_message([&] {
                    MoeLayer bad({.dim = 2, .experts = 4, .top_k = 1, .ffn_hidden = 2, .capacity_factor = -1}, "m");
                  }),
                  {"capacity factor -1", "or 0 (dropless)"});
}

}  // namespace
}  // namespace loom::test
