// Checkpoints and the HF weights beneath them: export/import (with GPT-2's Conv1D transpose),
// and saves that are atomic, verified and prunable (config.json round trips:
// test_hf_config.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf_config_support.hpp"
#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/core/error.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------- HF weights

// A hand-built parameter with values start, start+1, ... so a transpose is visible.
std::unique_ptr<Parameter> make_param(const std::string& name, const Shape& shape, float start,
                                      bool hf_transposed = false) {
  auto param = std::make_unique<Parameter>();
  param->name = name;
  param->hf_transposed = hf_transposed;
  param->value = Tensor::empty(shape, DType::F32, MemCategory::Parameters);
  for (int64_t i = 0; i < param->value.numel(); ++i) param->value.f32()[i] = start + static_cast<float>(i) * 0.25f;
  return param;
}

// A GPT-2-shaped model in miniature: embedding, a Conv1D weight [out=6, in=3] and its bias.
struct TinyModel {
  std::vector<std::unique_ptr<Parameter>> owned;
  ParameterList params;
  explicit TinyModel(float start) {
    owned.push_back(make_param("wte.weight", {5, 3}, start));
    owned.push_back(make_param("h.0.attn.c_attn.weight", {6, 3}, start + 100, /*hf_transposed=*/true));
    owned.push_back(make_param("h.0.attn.c_attn.bias", {6}, start + 200));
    for (auto& p : owned) params.push_back(p.get());
  }
  Parameter& conv() { return *owned[1]; }
};

SafetensorsFile file_of(std::vector<SafetensorsEntry> entries, const std::string& path = "in-memory") {
  SafetensorsFile file;
  file.path = path;
  file.entries = std::move(entries);
  return file;
}

std::vector<float> entry_floats(const SafetensorsEntry& entry) {
  std::vector<float> out(entry.bytes.size() / 4);
  std::memcpy(out.data(), entry.bytes.data(), entry.bytes.size());
  return out;
}

TEST(HfWeights, ExportTransposesConv1DWeightsToInOut) {
  TinyModel model(1.0f);
  const std::vector<SafetensorsEntry> entries = export_hf_weights(model.params, DType::F32);
  ASSERT_EQ(entries.size(), 3u);
  const SafetensorsEntry& conv = entries[1];
  EXPECT_EQ(conv.name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(conv.dtype, "F32");
  EXPECT_EQ(conv.shape, (Shape{3, 6})) << "HF Conv1D stores [in, out]";
  const std::vector<float> hf = entry_floats(conv);
  const float* loom_values = model.conv().value.f32();  // [out=6, in=3]
  for (int in = 0; in < 3; ++in)
    for (int out = 0; out < 6; ++out) EXPECT_EQ(hf[static_cast<size_t>(in * 6 + out)], loom_values[out * 3 + in]);
  EXPECT_EQ(entries[0].shape, (Shape{5, 3})) << "ordinary weights keep their layout";
  EXPECT_EQ(entry_floats(entries[0]), model.owned[0]->value.to_f32_vector());
}

TEST(HfWeights, F32RoundTripRestoresEveryValueExactly) {
  TinyModel source(1.0f);
  TinyModel target(-50.0f);
  import_hf_weights(target.params, file_of(export_hf_weights(source.params, DType::F32)));
  for (size_t i = 0; i < source.params.size(); ++i)
    EXPECT_EQ(target.params[i]->value.to_f32_vector(), source.params[i]->value.to_f32_vector())
        << source.params[i]->name;
}

TEST(HfWeights, Bf16RoundTripRoundsToNearestBf16) {
  TinyModel source(1.01f);
  TinyModel target(0.0f);
  const std::vector<SafetensorsEntry> entries = export_hf_weights(source.params, DType::BF16);
  EXPECT_EQ(entries[1].dtype, "BF16");
  EXPECT_EQ(entries[1].bytes.size(), 18u * 2);
  import_hf_weights(target.params, file_of(entries));
  for (size_t i = 0; i < source.params.size(); ++i) {
    const std::vector<float> want = source.params[i]->value.to_f32_vector();
    const std::vector<float> got = target.params[i]->value.to_f32_vector();
    for (size_t j = 0; j < want.size(); ++j) EXPECT_EQ(got[j], round_to_bf16(want[j])) << source.params[i]->name;
  }
}

TEST(HfWeights, MissingTensorNamesTheParameterAndLeavesValuesUntouched) {
  TinyModel source(1.0f);
  TinyModel target(-50.0f);
  std::vector<SafetensorsEntry> entries = export_hf_weights(source.params, DType::F32);
  entries.erase(entries.begin() + 2);
  expect_contains(error_message([&] { import_hf_weights(target.params, file_of(entries, "m.safetensors")); }),
                  {"m.safetensors", "missing tensor", "'h.0.attn.c_attn.bias'"});
  EXPECT_EQ(target.owned[0]->value.f32()[0], -50.0f) << "nothing may be copied before all checks pass";
}

TEST(HfWeights, ShapeMismatchSaysFoundAndExpected) {
  TinyModel source(1.0f);
  TinyModel target(0.0f);
  std::vector<SafetensorsEntry> entries = export_hf_weights(source.params, DType::F32);
  entries[1].shape = {6, 3};  // loom's layout, not HF's
  expect_contains(error_message([&] { import_hf_weights(target.params, file_of(entries)); }),
                  {"'h.0.attn.c_attn.weight'", "shape [6, 3] in the file", "expected [3, 6]"});
}

TEST(HfWeights, ExtraTensorsAreAnErrorExceptKnownBuffersAndTiedHead) {
  TinyModel source(1.0f);
  TinyModel target(0.0f);
  std::vector<SafetensorsEntry> entries = export_hf_weights(source.params, DType::F32);
  const std::vector<float> mask = {1, 0, 1, 1};
  SafetensorsEntry buffer{"h.0.attn.bias", "F32", {2, 2}, std::vector<uint8_t>(16)};
  std::memcpy(buffer.bytes.data(), mask.data(), 16);
  entries.push_back(buffer);
  entries.push_back({"h.0.attn.masked_bias", "F32", {}, std::vector<uint8_t>(4)});
  entries.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {1}, std::vector<uint8_t>(4)});
  entries.push_back({"lm_head.weight", "F32", {5, 3}, entries[0].bytes});  // tied: the model has no lm_head
  EXPECT_NO_THROW(import_hf_weights(target.params, file_of(entries)));

  entries.push_back({"h.7.mlp.c_fc.weight", "F32", {1}, std::vector<uint8_t>(4)});
  expect_contains(error_message([&] { import_hf_weights(target.params, file_of(entries)); }),
                  {"1 tensor(s) match no model parameter", "'h.7.mlp.c_fc.weight'"});
}

TEST(HfWeights, UnsupportedDtypeNamesTheParameter) {
  TinyModel model(0.0f);
  std::vector<SafetensorsEntry> entries = export_hf_weights(model.params, DType::F32);
  entries[2].dtype = "I32";
  expect_contains(error_message([&] { import_hf_weights(model.params, file_of(entries)); }),
                  {"'h.0.attn.c_attn.bias'", "I32"});
}

// ---------------------------------------------------------------- checkpoints

CheckpointPayload make_payload(int64_t step) {
  TinyModel model(static_cast<float>(step));
  CheckpointPayload payload;
  payload.config = hf_tiny_gpt2();
  payload.model_weights = export_hf_weights(model.params, DType::F32);
  for (const Parameter* p : model.params) {
    payload.optimizer_state.push_back(entry_from_tensor(p->name + ".exp_avg", p->value));
    payload.optimizer_state.push_back(entry_from_tensor(p->name + ".exp_avg_sq", p->value));
  }
  payload.optimizer_state.push_back({"step", "I64", {}, std::vector<uint8_t>(8, static_cast<uint8_t>(step))});
  payload.trainer_state = {{"step", step}, {"data", {{"shard", 3}, {"offset", 12345}}}, {"lr", 3e-4}};
  return payload;
}

void expect_same_entries(const std::vector<SafetensorsEntry>& want, const std::vector<SafetensorsEntry>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (const SafetensorsEntry& w : want) {
    const auto g = std::find_if(got.begin(), got.end(), [&](const SafetensorsEntry& e) { return e.name == w.name; });
    ASSERT_NE(g, got.end()) << w.name;
    EXPECT_EQ(g->dtype, w.dtype) << w.name;
    EXPECT_EQ(g->shape, w.shape) << w.name;
    EXPECT_EQ(g->bytes, w.bytes) << w.name;
  }
}

void expect_same_payload(const CheckpointPayload& want, const CheckpointPayload& got) {
  expect_same_config(want.config, got.config);
  expect_same_entries(want.model_weights, got.model_weights);
  expect_same_entries(want.optimizer_state, got.optimizer_state);
  EXPECT_EQ(want.trainer_state, got.trainer_state);
}

void flip_byte(const fs::path& path, size_t from_end) {
  std::vector<uint8_t> bytes = read_file_bytes(path.string());
  bytes[bytes.size() - from_end] ^= 0x40;
  atomic_write_file(path.string(), bytes.data(), bytes.size());
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A fresh directory per test, removed afterwards.
class CheckpointTest : public ::testing::Test {
 protected:
  TempDir dir_{"loom_checkpoint_test"};
};

TEST_F(CheckpointTest, SaveThenLoadRoundTripsEverything) {
  const fs::path root = dir_.path() / "ckpt";
  const CheckpointPayload payload = make_payload(10);
  const std::string dir = save_checkpoint(root.string(), 10, payload);
  EXPECT_EQ(dir, (root / "step_00000010").string());
  EXPECT_EQ(entries_of(dir),
            (std::vector<std::string>{"config.json", "manifest.json", "model.safetensors", "optimizer.safetensors",
                                      "trainer_state.json"}));
  EXPECT_EQ(read_text_file(root / "latest"), "step_00000010\n");
  expect_same_payload(payload, load_checkpoint(dir));
  expect_same_payload(payload, load_checkpoint(root.string()));

  // The manifest records the real size and CRC of every file.
  const json manifest = json::parse(read_text_file(fs::path(dir) / "manifest.json"));
  EXPECT_EQ(manifest["step"], 10);
  ASSERT_EQ(manifest["files"].size(), 4u);
  for (const auto& [name, record] : manifest["files"].items()) {
    const std::vector<uint8_t> bytes = read_file_bytes((fs::path(dir) / name).string());
    EXPECT_EQ(record["bytes"], bytes.size()) << name;
    EXPECT_EQ(record["crc32"], crc32_hex(crc32_of(bytes.data(), bytes.size()))) << name;
  }
  // transformers' from_pretrained needs both of these.
  EXPECT_EQ(read_safetensors((fs::path(dir) / "model.safetensors").string()).metadata.at("format"), "pt");
  EXPECT_EQ(json::parse(read_text_file(fs::path(dir) / "config.json"))["model_type"], "gpt2");
}

TEST_F(CheckpointTest, CorruptNewestCheckpointIsAnErrorNamingTheFile) {
  const fs::path root = dir_.path() / "ckpt";
  save_checkpoint(root.string(), 1, make_payload(1));
  const std::string newest = save_checkpoint(root.string(), 2, make_payload(2));
  const fs::path model = fs::path(newest) / "model.safetensors";

  flip_byte(model, 3);
  expect_contains(error_message([&] { load_checkpoint(root.string()); }), {model.string(), "corrupt"});

  std::vector<uint8_t> bytes = read_file_bytes(model.string());
  bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2), bytes.end());
  atomic_write_file(model.string(), bytes.data(), bytes.size());
  expect_contains(error_message([&] { load_checkpoint(newest); }), {model.string(), "truncated"});

  fs::remove(model);
  expect_contains(error_message([&] { load_checkpoint(newest); }), {model.string()});

  // The older checkpoint is unaffected.
  expect_same_payload(make_payload(1), load_checkpoint((root / "step_00000001").string()));
}

TEST_F(CheckpointTest, CorruptManifestOrConfigIsAnErrorNamingTheFile) {
  const fs::path root = dir_.path() / "ckpt";
  const fs::path dir = save_checkpoint(root.string(), 3, make_payload(3));
  atomic_write_file((dir / "manifest.json").string(), std::string("{\"format\": \"loom.checkpoint.v1\""));
  expect_contains(error_message([&] { load_checkpoint(dir.string()); }),
                  {(dir / "manifest.json").string(), "not valid JSON"});

  save_checkpoint(root.string(), 3, make_payload(3));
  flip_byte(dir / "config.json", 5);
  expect_contains(error_message([&] { load_checkpoint(dir.string()); }), {(dir / "config.json").string(), "corrupt"});
}

TEST_F(CheckpointTest, FailedSaveLeavesTheEarlierCheckpointAndLatestIntact) {
  const fs::path root = dir_.path() / "ckpt";
  const CheckpointPayload first = make_payload(1);
  save_checkpoint(root.string(), 1, first);

  // Bad input: a tensor whose bytes disagree with its shape.
  CheckpointPayload bad = make_payload(2);
  bad.model_weights[0].bytes.pop_back();
  expect_contains(error_message([&] { save_checkpoint(root.string(), 2, bad); }),
                  {"cannot save checkpoint step 2", "'wte.weight'"});
  // Same bad input re-saving the existing step must not touch it either.
  EXPECT_THROW(save_checkpoint(root.string(), 1, bad), Error);

  // A failure on disk after the files are written: the final name is taken by a plain file.
  std::ofstream(root / "step_00000002") << "not a checkpoint";
  expect_contains(error_message([&] { save_checkpoint(root.string(), 2, make_payload(2)); }),
                  {(root / "step_00000002").string(), "not a checkpoint directory"});

  EXPECT_EQ(read_text_file(root / "latest"), "step_00000001\n");
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "step_00000001").string());
  expect_same_payload(first, load_checkpoint(root.string()));
  EXPECT_EQ(entries_of(root), (std::vector<std::string>{"latest", "step_00000001", "step_00000002"}))
      << "no temp directory may be left behind";
}

TEST_F(CheckpointTest, RootThatIsAFileIsAClearError) {
  const fs::path root = dir_.path() / "a_file";
  std::ofstream(root) << "x";
  expect_contains(error_message([&] { save_checkpoint(root.string(), 1, make_payload(1)); }),
                  {root.string(), "not a directory"});
  EXPECT_EQ(latest_checkpoint(root.string()), std::nullopt);
}

TEST_F(CheckpointTest, ResavingAStepReplacesIt) {
  const fs::path root = dir_.path() / "ckpt";
  save_checkpoint(root.string(), 5, make_payload(5));
  CheckpointPayload updated = make_payload(6);
  updated.trainer_state["note"] = "second save";
  const std::string dir = save_checkpoint(root.string(), 5, updated);
  expect_same_payload(updated, load_checkpoint(dir));
  EXPECT_EQ(entries_of(root), (std::vector<std::string>{"latest", "step_00000005"}));
}

TEST_F(CheckpointTest, KeepLastPrunesOldestButNeverTheOneJustWritten) {
  const fs::path root = dir_.path() / "ckpt";
  for (int64_t step = 100; step <= 500; step += 100) save_checkpoint(root.string(), step, make_payload(step), 2);
  EXPECT_EQ(entries_of(root), (std::vector<std::string>{"latest", "step_00000400", "step_00000500"}));

  // Rolling back to an older step: it is kept although two newer ones exist.
  save_checkpoint(root.string(), 50, make_payload(50), 2);
  EXPECT_EQ(entries_of(root),
            (std::vector<std::string>{"latest", "step_00000050", "step_00000400", "step_00000500"}));
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "step_00000050").string());

  save_checkpoint(root.string(), 600, make_payload(600), 1);
  EXPECT_EQ(entries_of(root), (std::vector<std::string>{"latest", "step_00000600"}));
  EXPECT_THROW(save_checkpoint(root.string(), 700, make_payload(700), -1), Error);
}

TEST_F(CheckpointTest, LatestCheckpointIgnoresUnfinishedDirectories) {
  const fs::path root = dir_.path() / "ckpt";
  EXPECT_EQ(latest_checkpoint(root.string()), std::nullopt) << "missing root";
  fs::create_directories(root);
  EXPECT_EQ(latest_checkpoint(root.string()), std::nullopt) << "empty root";
  expect_contains(error_message([&] { load_checkpoint(root.string()); }), {root.string(), "neither"});

  save_checkpoint(root.string(), 7, make_payload(7));
  // A crashed save of a later step, complete with a manifest, must still be ignored.
  fs::copy(root / "step_00000007", root / "step_00000009.tmp-4242", fs::copy_options::recursive);
  fs::create_directories(root / "step_00000008");  // no manifest: unfinished
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "step_00000007").string());

  // Without `latest` (or when it names a vanished directory) the highest finished step wins.
  save_checkpoint(root.string(), 3, make_payload(3));
  fs::remove(root / "latest");
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "step_00000007").string());
  atomic_write_file((root / "latest").string(), std::string("step_00000099\n"));
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "step_00000007").string());

  atomic_write_file((root / "latest").string(), std::string("../../etc"));
  expect_contains(error_message([&] { latest_checkpoint(root.string()); }),
                  {(root / "latest").string(), "'../../etc'"});
}

TEST(CheckpointNames, StepDirectoriesArePaddedToEightDigits) {
  EXPECT_EQ(checkpoint_dir_name(0), "step_00000000");
  EXPECT_EQ(checkpoint_dir_name(1234), "step_00001234");
  EXPECT_EQ(checkpoint_dir_name(123456789), "step_123456789");
}

}  // namespace
}  // namespace loom::test
