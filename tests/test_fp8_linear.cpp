// The FP8 linear layer (model/fp8_linear.hpp) through Linear's public interface, two steps per
// recipe, against tests/torch_ref/check_fp8_linear.py: the same quantise-dequantise done in
// PyTorch from the recipes' definitions, and the amax history it should have kept.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/ckpt/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/model/linear.hpp"

namespace loom {
namespace {

Tensor random_tensor(const Shape& shape, double std, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  CounterRng rng(seed, 3);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(std * rng.normal(static_cast<uint64_t>(i)));
  return t;
}

struct Fp8LinearCase {
  Fp8Recipe recipe;
  Fp8Formats formats;
  int margin;
  const char* label;
  int64_t sequence_rows = 0;
};

class Fp8LinearCases : public ::testing::TestWithParam<Fp8LinearCase> {};

TEST_P(Fp8LinearCases, TwoStepsMatchTheTorchReference) {
  const Fp8LinearCase c = GetParam();
  // 200 inputs and 136 outputs: two 1 x 128 tiles per row (one partial) and 2 x 2 weight blocks;
  // 140 rows: two 128 x 1 tiles per column for the weight gradient (one partial), or, as two
  // sequences of 70, one per sequence.
  constexpr int64_t rows = 140, in = 200, out = 136, wide = 150, col = 7;
  Linear linear("l", in, out, true, false);
  auto context = std::make_shared<Fp8Context>();
  context->config = {c.recipe, c.formats, 16, c.margin, c.sequence_rows};
  Fp8Training training(context, {linear.enable_fp8(context)});
  linear.bias.value.copy_from(random_tensor({out}, 0.1, 1));

  std::vector<SafetensorsEntry> inputs = {entry_from_tensor("b", linear.bias.value)};
  Tensor out_wide = Tensor::zeros({rows, wide}, DType::F32, MemCategory::Workspace);
  Tensor d_x = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
  for (int step = 1; step <= 2; ++step) {
    // Step 2's values are 1.5x step 1's spread, so a delayed scale saturates some of them.
    const double spread = step == 1 ? 1.0 : 1.5;
    const Tensor x = random_tensor({rows, in}, spread, 10 + step);
    const Tensor w = random_tensor({out, in}, 0.05 * spread, 20 + step);
    // Output gradients wider than the layer's columns (it reads its own from column 7), of
    // the small size a loss over many tokens gives.
    const Tensor g_wide = random_tensor({rows, wide}, 1e-4 * spread, 30 + step);
    Tensor g = Tensor::empty({rows, out}, DType::F32, MemCategory::Workspace);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < out; ++k) g.f32()[r * out + k] = g_wide.f32()[r * wide + col + k];
    linear.weight.value.copy_from(w);
    linear.weight.grad.zero_();
    linear.bias.grad.zero_();
    training.begin_step();
    linear.forward(out_wide, col, x);
    linear.backward(d_x, false, g_wide, col, x);
    training.finish_step(true);
    const std::string s = std::to_string(step);
    inputs.push_back(entry_from_tensor("x" + s, x));
    inputs.push_back(entry_from_tensor("w" + s, w));
    inputs.push_back(entry_from_tensor("g" + s, g));
  }
  Tensor result = Tensor::empty({rows, out}, DType::F32, MemCategory::Workspace);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < out; ++k)
      result.f32()[r * out + k] = out_wide.f32()[r * wide + col + k];
  // The newest two amaxes of each operand's history (newest first).
  const std::vector<float> history = training.amax_history();
  Tensor newest = Tensor::empty({3, 2}, DType::F32, MemCategory::Workspace);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j)
      newest.f32()[i * 2 + j] = history[static_cast<size_t>(i * 16 + j)];

  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("loom_fp8_linear_" + std::string(c.label) + "_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/case.json") << nlohmann::json{
      {"recipe", fp8_recipe_name(c.recipe)},
      {"format", fp8_formats_name(c.formats)},
      {"margin", c.margin},
      {"sequence_rows", c.sequence_rows}}.dump();
  write_safetensors(dir + "/inputs.safetensors", inputs);
  write_safetensors(
      dir + "/loom.safetensors",
      {entry_from_tensor("out", result), entry_from_tensor("d_x", d_x),
       entry_from_tensor("d_w", linear.weight.grad), entry_from_tensor("d_b", linear.bias.grad),
       entry_from_tensor("history", newest)});
  const std::string command = "OMP_NUM_THREADS=1 /usr/bin/python3 " LOOM_SOURCE_DIR
                              "/tests/torch_ref/check_fp8_linear.py " +
                              dir;
  const int status = std::system(command.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0)
      << "check_fp8_linear.py found a mismatch in " << dir;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, Fp8LinearCases,
    ::testing::Values(
        Fp8LinearCase{Fp8Recipe::Delayed, Fp8Formats::Hybrid, 0, "delayed_hybrid"},
        Fp8LinearCase{Fp8Recipe::Delayed, Fp8Formats::E4M3, 1, "delayed_e4m3_margin1"},
        Fp8LinearCase{Fp8Recipe::Current, Fp8Formats::Hybrid, 0, "current_hybrid"},
        Fp8LinearCase{Fp8Recipe::Blockwise, Fp8Formats::Hybrid, 0, "blockwise_hybrid"},
        Fp8LinearCase{Fp8Recipe::Blockwise, Fp8Formats::E4M3, 0, "blockwise_e4m3"},
        Fp8LinearCase{Fp8Recipe::Blockwise, Fp8Formats::Hybrid, 0, "blockwise_two_sequences", 70}),
    [](const auto& info) { return std::string(info.param.label); });

// Tensor-parallel column layers run backward as two calls around a collective (Linear's
// input_grad, then weight_grad). They must give backward's gradients bit for bit, and a
// per-tensor recipe must quantise the output gradient once for both, as backward does (by hand:
// g [rows, out], w [out, in] and x [rows, in] once each; blockwise: g in 1 x 128 tiles for the
// input gradient and in 128 x 1 tiles with x for the weight gradient, w in blocks). A weight
// half on another gradient (here a copy at another address) quantises its own.
TEST(Fp8Linear, SplitHalvesEqualOneBackwardAndQuantiseTheGradientOnce) {
  constexpr int64_t rows = 140, in = 200, out = 136;
  for (Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Current, Fp8Recipe::Blockwise}) {
    SCOPED_TRACE(fp8_recipe_name(recipe));
    const Tensor x = random_tensor({rows, in}, 1.0, 41), g = random_tensor({rows, out}, 1e-4, 42);
    auto make = [&](Linear& linear) {
      auto context = std::make_shared<Fp8Context>();
      context->config.recipe = recipe;
      auto training = std::make_unique<Fp8Training>(
          context, std::vector<Fp8Linear*>{linear.enable_fp8(context)});
      linear.weight.value.copy_from(random_tensor({out, in}, 0.05, 43));
      training->begin_step();
      return training;
    };
    Linear whole("whole", in, out, true, false), split("split", in, out, true, false);
    auto whole_training = make(whole);
    auto split_training = make(split);
    Tensor d_x = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
    Tensor d_x_split = Tensor::zeros({rows, in}, DType::F32, MemCategory::Workspace);
    Fp8QuantizeTally& tally = fp8_quantize_tally();
    tally.reset();
    whole.backward(d_x, false, g, 0, x);
    const int64_t whole_elements =
        tally.tensor + tally.row_tiles + tally.column_tiles + tally.blocks;
    tally.reset();
    split.input_grad(d_x_split, false, g, 0);
    split.weight_grad(g, 0, x, true);
    if (recipe == Fp8Recipe::Blockwise) {
      EXPECT_EQ(tally.row_tiles, rows * out);
      EXPECT_EQ(tally.column_tiles, rows * out + rows * in);
      EXPECT_EQ(tally.blocks, out * in);
    } else {
      EXPECT_EQ(tally.tensor, rows * out + out * in + rows * in);
    }
    EXPECT_EQ(tally.tensor + tally.row_tiles + tally.column_tiles + tally.blocks, whole_elements);
    EXPECT_EQ(d_x_split.to_f32_vector(), d_x.to_f32_vector());
    EXPECT_EQ(split.weight.grad.to_f32_vector(), whole.weight.grad.to_f32_vector());
    EXPECT_EQ(split.bias.grad.to_f32_vector(), whole.bias.grad.to_f32_vector());

    // The held gradient serves only its own d_out: a copy elsewhere is quantised again.
    Tensor g_copy = Tensor::empty({rows, out}, DType::F32, MemCategory::Workspace);
    g_copy.copy_from(g);
    split.weight.grad.zero_();
    whole.weight.grad.zero_();
    tally.reset();
    split.input_grad(d_x_split, false, g, 0);
    split.weight_grad(g_copy, 0, x, false);
    whole.weight_grad(g, 0, x, false);
    if (recipe != Fp8Recipe::Blockwise) {
      EXPECT_EQ(tally.tensor, 2 * (rows * out + rows * in) + out * in + rows * out);
    }
    EXPECT_EQ(split.weight.grad.to_f32_vector(), whole.weight.grad.to_f32_vector());
  }
}

// A history of 2 keeps the newest two step amaxes; a skipped step's amax never enters it.
TEST(Fp8Linear, HistoryRollsAndSkippedStepsAreLeftOut) {
  Linear linear("l", 2, 1, false, false);
  auto context = std::make_shared<Fp8Context>();
  context->config.amax_history = 2;
  Fp8Training training(context, {linear.enable_fp8(context)});
  Tensor out = Tensor::zeros({1, 1}, DType::F32, MemCategory::Workspace);
  linear.weight.value.f32()[0] = 0.5f;
  linear.weight.value.f32()[1] = 0.25f;
  for (float amax : {3.0f, 5.0f, 7.0f, 11.0f}) {
    Tensor x = Tensor::empty({1, 2}, DType::F32, MemCategory::Workspace);
    x.f32()[0] = -amax;
    x.f32()[1] = 1.0f;
    training.begin_step();
    linear.forward(out, 0, x);
    training.finish_step(amax != 7.0f);  // the step that saw 7 was skipped
  }
  const std::vector<float> h = training.amax_history();  // input, weight, gradient; newest first
  EXPECT_EQ(h, (std::vector<float>{11.0f, 5.0f, 0.5f, 0.5f, 0.0f, 0.0f}));
  // Outside a step (evaluation) nothing is recorded.
  training.set_amax_history({1, 2, 3, 4, 5, 6});
  linear.forward(out, 0, Tensor::zeros({1, 2}, DType::F32, MemCategory::Workspace));
  EXPECT_EQ(training.amax_history(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_THROW(training.set_amax_history({1, 2}), Error);
}

}  // namespace
}  // namespace loom
