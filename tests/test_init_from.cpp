// train.init_from: a run starts from a Hugging Face model directory (config.json plus
// model.safetensors, or transformers' sharded index), GPT2LMHeadModel or LlamaForCausalLM.
// Here in one process: every weight arrives bit for bit (F32, BF16, sharded, the hub's GPT-2
// names), and bad directories are named errors. tests/dist/test_init_from.cpp: other layouts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/ckpt/safetensors.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/model/transformer.hpp"
#include "loom/core/dtype.hpp"
#include "loom/data/data_loader.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/trainer.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  ConfigReader reader = ConfigReader::from_string(text, "test.toml");
  reader.apply_overrides(overrides);
  return parse_train_config(reader);
}

// A "pretrained" model: trained on the run's learnable shards (ln 64 = 4.16 -> about 1.3 nats
// per token), so a run that did not load it would start from a very different loss.
std::unique_ptr<Trainer> pretrained_model(const TinyRun& run, const std::string& arch) {
  run.write_learnable_shards();
  auto trainer = std::make_unique<Trainer>(parse(run.config(arch, kLearnableSteps),
                                                 {kLearnableLr, "checkpoint.dir=\"\"", "eval.every=0",
                                                  "log.dir=\"" + run.dir + "/pretraining\""}));
  trainer->run();
  return trainer;
}

// What save_pretrained writes: config.json and model.safetensors in HF layout.
void write_hf_dir(const std::string& dir, const Transformer& model, DType dtype) {
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", export_hf_weights(model.parameters(), dtype), {{"format", "pt"}});
  write_text_file(dir + "/config.json", hf_config_json(model.config()).dump(2));
}

void expect_same_weights(Trainer& trainer, const Transformer& source, bool bf16_rounded) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* p : source.parameters()) by_name[p->name] = p;
  for (const Parameter* p : trainer.model().parameters()) {
    std::vector<float> expected = by_name.at(p->name)->value.to_f32_vector();
    if (bf16_rounded)
      for (float& x : expected) x = round_to_bf16(x);
    EXPECT_EQ(p->value.to_f32_vector(), expected) << p->name;
  }
}

class InitFrom : public ::testing::TestWithParam<std::string> {};

TEST_P(InitFrom, LoadsEveryWeightBitForBit) {
  const std::string arch = GetParam();
  TinyRun run("init_from_" + arch);
  const TrainConfig base = parse(run.config(arch));
  const auto pretrained = pretrained_model(run, arch);
  const Transformer* source = &pretrained->model();
  write_hf_dir(run.dir + "/hf", *source, DType::F32);

  Trainer trainer(parse(run.config(arch), {"train.init_from=\"" + run.dir + "/hf\""}));
  trainer.initialise_from(run.dir + "/hf");
  expect_same_weights(trainer, *source, false);

  // transformers' sharded form: two files and model.safetensors.index.json.
  const std::vector<SafetensorsEntry> entries = export_hf_weights(source->parameters(), DType::F32);
  const std::string sharded = run.dir + "/hf_sharded";
  std::filesystem::create_directories(sharded);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  std::vector<SafetensorsEntry> halves[2];
  for (size_t i = 0; i < entries.size(); ++i) {
    const int half = i < entries.size() / 2 ? 0 : 1;
    halves[half].push_back(entries[i]);
    index["weight_map"][entries[i].name] = "model-0000" + std::to_string(half + 1) + "-of-00002.safetensors";
  }
  for (int half = 0; half < 2; ++half)
    write_safetensors(sharded + "/model-0000" + std::to_string(half + 1) + "-of-00002.safetensors", halves[half],
                      {{"format", "pt"}});
  write_text_file(sharded + "/model.safetensors.index.json", index.dump());
  write_text_file(sharded + "/config.json", hf_config_json(source->config()).dump());
  Trainer from_sharded(base);
  from_sharded.initialise_from(sharded);
  expect_same_weights(from_sharded, *source, false);

  // BF16 weights (Llama's published dtype) arrive rounded, into a bf16 run's fp32 masters too.
  write_hf_dir(run.dir + "/hf_bf16", *source, DType::BF16);
  Trainer bf16(parse(run.config(arch), {"train.precision=\"bf16\""}));
  bf16.initialise_from(run.dir + "/hf_bf16");
  expect_same_weights(bf16, *source, true);
}

TEST_P(InitFrom, RunStartsFromTheWeightsAndACheckpointWins) {
  const std::string arch = GetParam();
  TinyRun run("init_from_run_" + arch);
  const auto pretrained = pretrained_model(run, arch);
  Transformer* source = &pretrained->model();
  write_hf_dir(run.dir + "/hf", *source, DType::F32);
  const std::vector<std::string> init = {"train.init_from=\"" + run.dir + "/hf\"", "checkpoint.dir=\"\"",
                                         "eval.every=0", "optim.warmup_steps=0"};
  // The first step's loss is the pretrained model's on the first batch.
  TrainConfig config = parse(run.config(arch, 1), init);
  Trainer trainer(config);
  const TrainSummary summary = trainer.run();
  std::vector<int32_t> inputs(static_cast<size_t>(config.batch_size * config.seq_len)), targets(inputs.size());
  DataLoader loader = DataLoader::from_pattern(config.train_data, config.batch_size, config.seq_len,
                                               config.model.vocab_size);
  if (config.shuffle) loader.set_shuffle(config.seed);
  double expected = 0;
  for (int64_t micro = 0; micro < config.grad_accum; ++micro) {
    loader.next_batch(inputs.data(), targets.data());
    expected += source->forward(inputs.data(), targets.data(), config.batch_size, config.seq_len, {false, 1.0f});
  }
  expected /= static_cast<double>(config.grad_accum * config.batch_size * config.seq_len);
  const auto losses = losses_of(config.run_dir + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_NEAR(losses[0], expected, 1e-6 * expected);
  EXPECT_LT(losses[0], 2.0) << "the pretrained model's loss, far below a fresh model's ln 64 = 4.16";
  (void)summary;

  // A run with checkpoints resumes from its latest one, not from init_from.
  Trainer first(parse(run.config(arch, 4), {"train.init_from=\"" + run.dir + "/hf\"", "checkpoint.every=2"}));
  first.run();
  Trainer resumed(parse(run.config(arch, 6), {"train.init_from=\"" + run.dir + "/hf\"", "checkpoint.every=2"}));
  EXPECT_EQ(resumed.run().first_step, 4);
}

INSTANTIATE_TEST_SUITE_P(Architectures, InitFrom, ::testing::Values("gpt2", "llama"));

TEST(InitFromHub, Gpt2NamesWithoutTheTransformerPrefixLoad) {
  TinyRun run("init_from_hub");
  const TrainConfig base = parse(run.config("gpt2"));
  const auto pretrained = pretrained_model(run, "gpt2");
  const Transformer* source = &pretrained->model();
  std::vector<SafetensorsEntry> entries = export_hf_weights(source->parameters(), DType::F32);
  for (SafetensorsEntry& e : entries)
    if (e.name.rfind("transformer.", 0) == 0) e.name = e.name.substr(std::strlen("transformer."));
  std::filesystem::create_directories(run.dir + "/hub");
  write_safetensors(run.dir + "/hub/model.safetensors", entries, {{"format", "pt"}});
  write_text_file(run.dir + "/hub/config.json", hf_config_json(source->config()).dump());
  Trainer trainer(base);
  trainer.initialise_from(run.dir + "/hub");
  expect_same_weights(trainer, *source, false);
}

TEST(InitFromErrors, NameTheDirectoryAndTheProblem) {
  TinyRun run("init_from_errors");
  const TrainConfig base = parse(run.config("llama"));
  const auto pretrained = pretrained_model(run, "llama");
  const Transformer* source = &pretrained->model();
  write_hf_dir(run.dir + "/hf", *source, DType::F32);

  EXPECT_THAT(error_message([&] { parse(run.config("llama"), {"train.init_from=\"" + run.dir + "/nope\""}); }),
              AllOf(HasSubstr("train.init_from"), HasSubstr(run.dir + "/nope")));
  // Another shape: named by its key.
  Trainer wider(parse(run.config("llama"), {"model.n_layer=3"}));
  EXPECT_THAT(error_message([&] { wider.initialise_from(run.dir + "/hf"); }),
              AllOf(HasSubstr("train.init_from"), HasSubstr("n_layer")));
  // A missing tensor, by name; nothing else read.
  std::vector<SafetensorsEntry> entries = export_hf_weights(source->parameters(), DType::F32);
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [](const SafetensorsEntry& e) { return e.name == "model.norm.weight"; }),
                entries.end());
  std::filesystem::create_directories(run.dir + "/partial");
  write_safetensors(run.dir + "/partial/model.safetensors", entries, {{"format", "pt"}});
  write_text_file(run.dir + "/partial/config.json", hf_config_json(source->config()).dump());
  Trainer trainer(base);
  EXPECT_THAT(error_message([&] { trainer.initialise_from(run.dir + "/partial"); }),
              AllOf(HasSubstr(run.dir + "/partial"), HasSubstr("model.norm.weight")));
  // No weights at all; an index naming a file that is not there.
  std::filesystem::create_directories(run.dir + "/empty");
  write_text_file(run.dir + "/empty/config.json", hf_config_json(source->config()).dump());
  EXPECT_THAT(error_message([&] { trainer.initialise_from(run.dir + "/empty"); }),
              HasSubstr("neither model.safetensors nor model.safetensors.index.json"));
  write_text_file(run.dir + "/empty/model.safetensors.index.json",
                  R"({"weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}})");
  EXPECT_THAT(error_message([&] { trainer.initialise_from(run.dir + "/empty"); }),
              HasSubstr("model-00001-of-00001.safetensors"));
}

// A model built by the independent PyTorch reference (tests/torch_ref/make_hf_model.py: a Llama
// with GQA, an untied head and rope_theta 5e5; the same with Llama 3.1's rope_scaling; a Mixtral
// of 4 experts, top 2; a tied GPT-2), saved in Hugging Face's layout with
// transformers' config keys, loads as train.init_from reads it and computes the reference's
// logits at every position and its loss. The reference runs in float64 on the same float32
// weights, so the difference is loom's float32 arithmetic: 1e-5 of the largest logit.
class InitFromTorchReference : public ::testing::TestWithParam<std::string> {};

TEST_P(InitFromTorchReference, LogitsAndLossMatchTheReference) {
  const std::string arch = GetParam();
  TempDir dir("loom_init_from_torch_" + arch);
  const std::string out = dir.file("model");
  const std::string command = "OMP_NUM_THREADS=1 /usr/bin/python3 " LOOM_SOURCE_DIR "/tests/torch_ref/make_hf_model.py " +
                              out + " " + arch;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  const CheckpointReader reader = CheckpointReader::hugging_face_model(out);
  Transformer model(reader.config());
  for (Parameter* p : model.parameters())
    reader.read({p->name, p->value.shape(), p->hf_transposed}, 0, p->value.numel(), p->value.f32());

  const SafetensorsFile reference = read_safetensors(out + "/reference.safetensors");
  auto entry = [&](const std::string& name) -> const SafetensorsEntry& { return reference.at(name); };
  const SafetensorsEntry& inputs_entry = entry("inputs");
  const int64_t batch = inputs_entry.shape[0], seq = inputs_entry.shape[1], vocab = model.config().vocab_size;
  std::vector<int32_t> inputs(static_cast<size_t>(batch * seq)), targets(inputs.size());
  std::memcpy(inputs.data(), inputs_entry.bytes.data(), inputs.size() * 4);
  std::memcpy(targets.data(), entry("targets").bytes.data(), targets.size() * 4);
  std::vector<float> logits(static_cast<size_t>(batch * seq * vocab));
  std::memcpy(logits.data(), entry("logits").bytes.data(), logits.size() * 4);
  float loss = 0;
  std::memcpy(&loss, entry("loss").bytes.data(), 4);

  float largest = 0;
  for (const float l : logits) largest = std::max(largest, std::abs(l));
  ASSERT_GT(largest, 0.5f);  // logits with something to compare
  double worst = 0;
  for (int64_t t = 1; t <= seq; ++t) {  // logits at position t-1: the last of each prefix of length t
    std::vector<int32_t> prefix;
    for (int64_t b = 0; b < batch; ++b)
      prefix.insert(prefix.end(), inputs.begin() + b * seq, inputs.begin() + b * seq + t);
    const std::vector<float> ours = model.last_logits(prefix.data(), batch, t);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t v = 0; v < vocab; ++v)
        worst = std::max(worst, static_cast<double>(std::abs(ours[static_cast<size_t>(b * vocab + v)] -
                                                             logits[static_cast<size_t>((b * seq + t - 1) * vocab + v)])));
  }
  EXPECT_LE(worst, 1e-5 * largest) << arch << ": largest logit " << largest;
  const double ours_loss =
      model.forward(inputs.data(), targets.data(), batch, seq, {false, 1.0f}) / static_cast<double>(batch * seq);
  EXPECT_NEAR(ours_loss, loss, 1e-5 * loss);
  EXPECT_GT(std::abs(loss - std::log(static_cast<double>(vocab))), 0.05);  // not a uniform model
}

INSTANTIATE_TEST_SUITE_P(Architectures, InitFromTorchReference, ::testing::Values("llama", "llama31", "mixtral", "gpt2"),
                         [](const auto& info) { return info.param; });

// The shipped fine-tuning configs describe the models they name: their [model] equals what the
// hub's config.json files give (openai-community/gpt2 and meta-llama/Meta-Llama-3-8B, as
// published, dropout and generation keys included), so init_from accepts them.
TEST(FineTuningConfigs, DescribeTheHubModelsTheyStartFrom) {
  const nlohmann::json gpt2 = nlohmann::json::parse(R"({"activation_function": "gelu_new",
      "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1,
      "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
      "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
      "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
      "summary_type": "cls_index", "summary_use_proj": true,
      "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257})");
  const nlohmann::json llama3 = nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
      "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
      "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
      "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
      "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})");
  // The model directories are the user's to download; a stand-in directory passes the
  // config's check that init_from names one.
  TempDir models("loom_finetune_configs");
  auto read = [&](const std::string& file) {
    ConfigReader reader = ConfigReader::from_file(std::string(LOOM_SOURCE_DIR) + "/configs/" + file);
    EXPECT_THAT(reader.get_string("train.init_from", ""), HasSubstr("models/")) << file;
    reader.apply_overrides({"train.init_from=\"" + models.path().string() + "\""});
    return parse_train_config(reader);
  };
  for (const auto& [file, hub] : {std::pair{"finetune_gpt2.toml", gpt2}, std::pair{"finetune_llama3.toml", llama3}})
    EXPECT_NO_THROW(require_same_model(read(file).model, model_config_from_hf_json(hub), file)) << file;
  const TrainConfig llama = read("finetune_llama3.toml");
  ASSERT_EQ(llama.train_sources.size(), 2u);
  EXPECT_EQ(llama.train_sources[0].weight, 4.0);
}

}  // namespace
}  // namespace loom::test
