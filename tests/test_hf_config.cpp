// config.json round trips: loom's model config written and read under transformers' keys
// (GPT-2, Llama, Mistral, Mixtral), published configs read as their models, bad ones refused
// naming the key.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "hf_config_support.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/core/error.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using json = nlohmann::json;

TEST(HfConfig, Gpt2RoundTripsThroughTransformersKeys) {
  const ModelConfig config = model_preset("gpt2-124m");
  const json hf = hf_config_json(config);
  EXPECT_EQ(hf["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(hf["model_type"], "gpt2");
  EXPECT_EQ(hf["vocab_size"], 50257);
  EXPECT_EQ(hf["n_positions"], 1024);
  EXPECT_EQ(hf["n_embd"], 768);
  EXPECT_EQ(hf["n_layer"], 12);
  EXPECT_EQ(hf["n_head"], 12);
  EXPECT_EQ(hf["n_inner"], 3072);
  EXPECT_EQ(hf["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(hf["activation_function"], "gelu_new");
  EXPECT_EQ(hf["tie_word_embeddings"], true);
  EXPECT_EQ(hf["torch_dtype"], "float32");
  // Through text, as it travels in config.json.
  expect_same_config(model_config_from_hf_json(json::parse(hf.dump())), config);
}

TEST(HfConfig, LlamaWithGroupedQueryAttentionRoundTrips) {
  const ModelConfig config = gqa_llama();
  const json hf = hf_config_json(config);
  EXPECT_EQ(hf["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(hf["model_type"], "llama");
  EXPECT_EQ(hf["hidden_size"], 64);
  EXPECT_EQ(hf["intermediate_size"], 176);
  EXPECT_EQ(hf["num_hidden_layers"], 3);
  EXPECT_EQ(hf["num_attention_heads"], 8);
  EXPECT_EQ(hf["num_key_value_heads"], 2);
  EXPECT_EQ(hf["max_position_embeddings"], 256);
  EXPECT_EQ(hf["rms_norm_eps"], 1e-6);
  EXPECT_EQ(hf["rope_theta"], 500000.0);
  EXPECT_EQ(hf["tie_word_embeddings"], false);
  EXPECT_EQ(hf["hidden_act"], "silu");
  expect_same_config(model_config_from_hf_json(json::parse(hf.dump())), config);
}

// An explicit head width (HF's head_dim) is written and read back; one that spells out
// hidden_size / num_attention_heads reads as no override. Mistral NeMo's published config.json
// (mistralai/Mistral-Nemo-Base-2407: 40 layers of 5120, 32 heads of 128, 8 kv heads, 14336,
// vocabulary 131,072, untied) reads as a Llama with 4096-wide attention, and its sliding window
// must be null.
TEST(HfConfig, ExplicitHeadDimRoundTripsAndMistralNemoReads) {
  ModelConfig config = gqa_llama();
  config.attention_head_dim = 16;  // 8 heads of 16 = 128 on a 64-wide stream
  json hf = hf_config_json(config);
  EXPECT_EQ(hf["head_dim"], 16);
  expect_same_config(model_config_from_hf_json(json::parse(hf.dump())), config);
  hf["head_dim"] = 8;  // = 64 / 8
  EXPECT_EQ(model_config_from_hf_json(hf).attention_head_dim, 0);
  EXPECT_FALSE(hf_config_json(gqa_llama()).contains("head_dim"));

  const json nemo = {{"architectures", {"MistralForCausalLM"}},
                     {"model_type", "mistral"},
                     {"hidden_size", 5120},
                     {"head_dim", 128},
                     {"intermediate_size", 14336},
                     {"max_position_embeddings", 1024000},
                     {"num_attention_heads", 32},
                     {"num_hidden_layers", 40},
                     {"num_key_value_heads", 8},
                     {"rms_norm_eps", 1e-5},
                     {"rope_theta", 1000000.0},
                     {"sliding_window", nullptr},
                     {"tie_word_embeddings", false},
                     {"vocab_size", 131072},
                     {"hidden_act", "silu"}};
  const ModelConfig read = model_config_from_hf_json(nemo);
  EXPECT_EQ(read.head_dim(), 128);
  EXPECT_EQ(read.q_dim(), 4096);
  // By hand: embeddings and head 2 x 131072 x 5120 = 1,342,177,280; per layer q and o 2 x 5120 x
  // 4096 = 41,943,040, k and v 2 x 5120 x 1024 = 10,485,760, MLP 3 x 5120 x 14336 = 220,200,960,
  // norms 2 x 5120: 272,640,000 x 40 = 10,905,600,000; final norm 5120. 12,247,782,400 in all.
  EXPECT_EQ(read.parameter_count(), 12247782400);
}

// Sliding windows: Mistral 7B v0.1's on every layer; gpt-oss's layer_types (a 128-key window on
// layer 0, global on layer 1, and so on) as loom's every-2nd-layer-global; a window at least as
// long as the context is none; layer_types that follow no every-G-th pattern are refused.
TEST(HfConfig, SlidingWindowsReadAndRoundTrip) {
  json mistral = hf_config_json(gqa_llama());
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 64;
  ModelConfig read = model_config_from_hf_json(mistral);
  EXPECT_EQ(read.sliding_window, 64);
  EXPECT_EQ(read.global_attention_every, 0);
  EXPECT_EQ(read.windowed_layer_count(), 3);
  mistral["sliding_window"] = 256;  // = max_position_embeddings
  EXPECT_EQ(model_config_from_hf_json(mistral).sliding_window, 0);

  ModelConfig alternating = gqa_llama();
  alternating.n_layer = 4;
  alternating.sliding_window = 128;
  alternating.global_attention_every = 2;
  const json hf = hf_config_json(alternating);
  // transformers' MistralConfig would ignore layer_types and window every layer: loom's own type.
  EXPECT_EQ(hf["model_type"], "loom_mistral");
  EXPECT_EQ(hf_config_json(read)["model_type"], "mistral");  // every layer windowed: Mistral's
  EXPECT_EQ(hf["sliding_window"], 128);
  EXPECT_EQ(hf["layer_types"], json::array({"sliding_attention", "full_attention",
                                            "sliding_attention", "full_attention"}));
  expect_same_config(model_config_from_hf_json(json::parse(hf.dump())), alternating);

  json odd = hf;
  odd["layer_types"] =
      json::array({"sliding_attention", "full_attention", "full_attention", "sliding_attention"});
  expect_contains(error_message([&] { (void)model_config_from_hf_json(odd); }),
                  {"'layer_types'", "every G-th"});
  odd["layer_types"] = json::array({"sliding_attention", "full_attention"});  // not one per layer
  expect_contains(error_message([&] { (void)model_config_from_hf_json(odd); }), {"'layer_types'"});
  odd = hf;
  odd["sliding_window"] = -3;
  expect_contains(error_message([&] { (void)model_config_from_hf_json(odd); }),
                  {"'sliding_window'", "-3"});
}

// A mixture of experts is written as transformers' Mixtral config (and read back with loom's
// router options); a Mixtral config.json as published (no output_router_logits, so no
// balancing loss in transformers' training) reads as that model.
TEST(HfConfig, MixtralRoundTripsAndReadsAsPublished) {
  ModelConfig config = gqa_llama();
  config.n_experts = 8;
  config.experts_per_token = 2;
  config.moe_router = MoeRouter::Sigmoid;
  config.moe_aux_loss_coef = 0.02;
  config.moe_z_loss_coef = 0.001;
  config.moe_capacity_factor = 1.25;
  config.moe_bias_rate = 0.001;
  const json hf = hf_config_json(config);
  EXPECT_EQ(hf["architectures"], json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(hf["model_type"], "mixtral");
  EXPECT_EQ(hf["num_local_experts"], 8);
  EXPECT_EQ(hf["num_experts_per_tok"], 2);
  EXPECT_EQ(hf["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(hf["output_router_logits"], true);
  expect_same_config(model_config_from_hf_json(json::parse(hf.dump())), config);
  EXPECT_FALSE(hf.contains("moe_intermediate_size"))
      << "a plain Mixtral writes only Mixtral's keys";
  // DeepSeek's shape: narrower experts after dense first layers, under DeepSeek-V3's key names.
  ModelConfig deepseek = config;
  deepseek.n_layer = 4;
  deepseek.moe_ffn_hidden = 16;
  deepseek.moe_first_dense = 1;
  deepseek.moe_every = 2;
  const json ds = hf_config_json(deepseek);
  EXPECT_EQ(ds["moe_intermediate_size"], 16);
  EXPECT_EQ(ds["first_k_dense_replace"], 1);
  EXPECT_EQ(ds["loom_moe_every"], 2);
  const ModelConfig back = model_config_from_hf_json(json::parse(ds.dump()));
  EXPECT_EQ(back.moe_ffn_hidden, 16);
  EXPECT_EQ(back.moe_first_dense, 1);
  EXPECT_EQ(back.moe_every, 2);
  EXPECT_EQ(back.parameter_count(), deepseek.parameter_count());

  json published = hf_config_json(gqa_llama());
  published["model_type"] = "mixtral";
  published["num_local_experts"] = 8;
  published["num_experts_per_tok"] = 2;
  published["router_aux_loss_coef"] = 0.02;
  published["sliding_window"] = nullptr;
  const ModelConfig mixtral = model_config_from_hf_json(published);
  EXPECT_EQ(mixtral.n_experts, 8);
  EXPECT_EQ(mixtral.experts_per_token, 2);
  EXPECT_EQ(mixtral.moe_router, MoeRouter::Softmax);
  EXPECT_EQ(mixtral.moe_aux_loss_coef, 0.0);  // output_router_logits absent (false)
  published["sliding_window"] = 8;            // shorter than the context: every layer windowed
  EXPECT_EQ(model_config_from_hf_json(published).sliding_window, 8);
  EXPECT_EQ(model_config_from_hf_json(published).windowed_layer_count(), 3);
  published["sliding_window"] = "wide";
  expect_contains(error_message([&] { (void)model_config_from_hf_json(published); }),
                  {"sliding_window", "wide"});
  published["sliding_window"] = nullptr;
  published["num_experts_per_tok"] = 9;
  expect_contains(error_message([&] { (void)model_config_from_hf_json(published); }),
                  {"experts_per_token: got 9", "1 to model.n_experts = 8"});
}

TEST(HfConfig, HfDefaultsApplyWhenOptionalKeysAreAbsent) {
  json hf = hf_config_json(model_preset("gpt2-124m"));
  hf["n_inner"] = nullptr;  // what HF's own gpt2 config.json says
  hf.erase("tie_word_embeddings");
  const ModelConfig gpt2 = model_config_from_hf_json(hf);
  EXPECT_EQ(gpt2.ffn_hidden, 4 * 768);
  EXPECT_TRUE(gpt2.tied_embeddings);

  json llama = hf_config_json(gqa_llama());
  llama.erase("num_key_value_heads");
  EXPECT_EQ(model_config_from_hf_json(llama).n_kv_head, 8);
}

// Llama 3.1 8B's rope_scaling as published reads into the model config and writes back.
TEST(HfConfig, Llama31RopeScalingRoundTrips) {
  json hf = hf_config_json(gqa_llama());
  hf["rope_scaling"] = {{"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192},
                        {"rope_type", "llama3"}};
  const ModelConfig config = model_config_from_hf_json(hf);
  EXPECT_EQ(config.rope_scaling_factor, 8.0);
  EXPECT_EQ(config.rope_low_freq_factor, 1.0);
  EXPECT_EQ(config.rope_high_freq_factor, 4.0);
  EXPECT_EQ(config.rope_original_max_positions, 8192);
  EXPECT_EQ(hf_config_json(config)["rope_scaling"], hf["rope_scaling"]);
  EXPECT_FALSE(hf_config_json(gqa_llama()).contains("rope_scaling"));
}

TEST(HfConfig, BadConfigsNameTheKey) {
  json hf = hf_config_json(gqa_llama());
  hf.erase("hidden_size");
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"missing required key 'hidden_size'"});

  hf = hf_config_json(gqa_llama());
  hf["num_hidden_layers"] = "three";
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"'num_hidden_layers'", "\"three\"", "expected an integer"});

  hf = hf_config_json(gqa_llama());
  hf["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"'rope_scaling'", "low_freq_factor"});
  hf["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"'rope_scaling'", "yarn", "llama3"});

  hf = hf_config_json(gqa_llama());
  hf["num_key_value_heads"] = 3;  // does not divide 8 heads
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"invalid model", "n_kv_head"});

  hf = hf_config_json(gqa_llama());
  hf["model_type"] = "qwen3";  // its q/k norms are not loom's Llama
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }), {"'model_type'", "qwen3"});

  hf = hf_config_json(gqa_llama());
  hf["head_dim"] = 0;
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"'head_dim'", "positive"});

  hf = hf_config_json(hf_tiny_gpt2());
  hf["activation_function"] = "relu";
  expect_contains(error_message([&] { model_config_from_hf_json(hf); }),
                  {"'activation_function'", "relu"});
}

}  // namespace
}  // namespace loom::test
