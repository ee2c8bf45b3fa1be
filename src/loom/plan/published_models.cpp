#include "loom/plan/published_models.hpp"

#include <cctype>
#include <cmath>
#include <regex>
#include <vector>

#include "loom/plan/published_model_shapes.hpp"

namespace loom::plan {

namespace published_model_table {

namespace {

const char* const kLlama1 =
    "Touvron et al. 2023, 'LLaMA: Open and Efficient Foundation Language Models' (arXiv 2302.13971), Table 2 "
    "(dimension, heads, layers, 4.0M-token batch); FFN widths and the 32,000-token vocabulary from the released "
    "params.json / tokenizer (SwiGLU width 2/3 x 4d rounded up to a multiple of 256)";
const char* const kLlama2 =
    "Touvron et al. 2023, 'Llama 2: Open Foundation and Fine-Tuned Chat Models' (arXiv 2307.09288), sec. 2.2 and "
    "Table 1 (4k context, GQA for 70B, 4M-token batch); FFN widths and vocabulary from the released config.json";
const char* const kLlama3 =
    "Llama Team 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 3 (layers, model dimension, FFN "
    "dimension, heads, 8 key/value heads, 8K context); vocabulary 128,256 from the released config.json";

const char* const kLlama32 = "Llama 3.2 1B / 3B config.json (meta-llama, 2024)";
const char* const kQwen25 = "Qwen Team 2024, 'Qwen2.5 Technical Report' (arXiv 2412.15115), Table 1; config.json";
const char* const kQwen3 =
    "Qwen Team 2025, 'Qwen3 Technical Report' (arXiv 2505.09388), Tables 1 and 2; the released "
    "config.json files "
    "(head_dim 128, vocabulary 151,936)";
const char* const kGptOss =
    "OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card' (arXiv 2508.10925); config.json";
const char* const kGptOssApprox =
    "its attention and expert biases and per-head attention sinks are not counted (under 0.1% of "
    "the parameters)";
const char* const kGemma2 = "Gemma Team 2024, 'Gemma 2' (arXiv 2408.00118), Table 1; config.json";
const char* const kGemma3 =
    "Gemma Team 2025, 'Gemma 3 Technical Report' (arXiv 2503.19786), Table 1; config.json";
const char* const kGemmaApprox =
    "GeGLU charged as SwiGLU (the same 3 matrices); the norms after attention and MLP and the "
    "logit soft-capping "
    "are not charged";
const char* const kLlama4 =
    "meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E config.json (text_config); NeMo "
    "llama.py "
    "Llama4Experts16Config / Llama4Experts128Config";
const char* const kLlama4Approx =
    "its chunked attention (8192-key chunks on 3 layers of 4) charged as causal attention, the "
    "same at 8192 tokens "
    "and below";
const char* const kNemotron3 =
    "NeMo nemotron.py Nemotron3Config8B / Nemotron3Config22B; NeMo-Framework-Launcher "
    "conf/training/nemotron/nemotron_{8b,22b}.yaml";
const char* const kNemotron4 =
    "Parmar et al. 2024, 'Nemotron-4 15B Technical Report' (arXiv 2402.16819), sec. 2; Nvidia "
    "2024, 'Nemotron-4 "
    "340B Technical Report' (arXiv 2406.11704), Table 1";

}  // namespace

const std::vector<Entry>& recent_entries() {
  static const std::vector<Entry> all = {
      {"llama1",
       7,
       {"LLaMA 7B", llama_shape(32, 4096, 32, 32, 11008, 32000, 2048), 4 << 20, kLlama1, "", ""}},
      {"llama1",
       13,
       {"LLaMA 13B", llama_shape(40, 5120, 40, 40, 13824, 32000, 2048), 4 << 20, kLlama1, "", ""}},
      // Table 2 names it 33B (32.5B parameters); the weights were first released as "30B".
      {"llama1",
       30,
       {"LLaMA 30B/33B", llama_shape(60, 6656, 52, 52, 17920, 32000, 2048), 4 << 20, kLlama1, "",
        ""}},
      {"llama1",
       33,
       {"LLaMA 30B/33B", llama_shape(60, 6656, 52, 52, 17920, 32000, 2048), 4 << 20, kLlama1, "",
        ""}},
      {"llama1",
       65,
       {"LLaMA 65B", llama_shape(80, 8192, 64, 64, 22016, 32000, 2048), 4 << 20, kLlama1, "", ""}},
      {"llama2",
       7,
       {"Llama 2 7B", llama_shape(32, 4096, 32, 32, 11008, 32000, 4096), 4 << 20, kLlama2, "", ""}},
      {"llama2",
       13,
       {"Llama 2 13B", llama_shape(40, 5120, 40, 40, 13824, 32000, 4096), 4 << 20, kLlama2, "",
        ""}},
      {"llama2",
       70,
       {"Llama 2 70B", llama_shape(80, 8192, 64, 8, 28672, 32000, 4096), 4 << 20, kLlama2, "", ""}},
      {"llama3",
       8,
       {"Llama 3 8B", llama_shape(32, 4096, 32, 8, 14336, 128256, 8192), 0, kLlama3, "", ""}},
      {"llama3",
       70,
       {"Llama 3 70B", llama_shape(80, 8192, 64, 8, 28672, 128256, 8192), 0, kLlama3, "", ""}},
      {"llama3",
       405,
       {"Llama 3 405B", llama_shape(126, 16384, 128, 8, 53248, 128256, 8192), 0, kLlama3, "", ""}},
      // Brown et al. 2020, 'Language Models are Few-Shot Learners' (arXiv 2005.14165), Table 2.1:
      // 96 layers, d_model 12288, 96 heads of 128, context 2048, 3.2M-token batch; GPT-2's
      // 50,257-token BPE vocabulary (sec. 2.1 follows GPT-2).
      {"gpt3",
       175,
       {"GPT-3 175B", gpt_shape(96, 12288, 96, 50257, 2048), 3200000,
        "Brown et al. 2020, Table 2.1", "", ""}},
      // NeMo's GPT-3 5B recipe (NVIDIA NeMo-Framework-Launcher, launcher_scripts/conf/training/
      // gpt3/5b.yaml): 24 layers, hidden 4096, FFN 16384, 32 heads, sequence 2048; GPT-2 BPE
      // vocabulary padded to a multiple of 128 (50,304).
      {"gpt3",
       5,
       {"NeMo GPT-3 5B", gpt_shape(24, 4096, 32, 50304, 2048), 0,
        "NeMo-Framework-Launcher conf/training/gpt3/5b.yaml", "", ""}},
      // NeMo's GPT-3 20B recipe (GPTConfig20B; Launcher conf/training/gpt3/20b.yaml): 44 layers
      // of 6144, 48 heads, FFN 4h, sequence 2048, the 51,200-token vocabulary of its benchmarks.
      {"gpt3",
       20,
       {"NeMo GPT-3 20B", gpt_shape(44, 6144, 48, 51200, 2048), 0,
        "NeMo GPTConfig20B; Launcher conf/training/gpt3/20b.yaml", "", ""}},
      // gpt-oss (the model card and config.json): 36 / 24 layers, residual width 2880, 64 query
      // heads of 64 (4096 wide) and 8 kv heads, experts of 2880, 128 / 32 of them, top 4;
      // layers alternate a 128-key sliding window (layer 0) and global attention; vocabulary
      // 201,088, untied; pre-trained at 4096 tokens. The card: 116.83B (5.13B active) and
      // 20.91B (3.61B).
      {"gptoss",
       120,
       {"GPT-OSS 120B",
        windowed(
            heads_of(experts_of(llama_shape(36, 2880, 64, 8, 2880, 201088, 4096), 128, 4, 2880),
                     64),
            128, 2),
        0, kGptOss, "", kGptOssApprox}},
      {"gptoss",
       20,
       {"GPT-OSS 20B",
        windowed(
            heads_of(experts_of(llama_shape(24, 2880, 64, 8, 2880, 201088, 4096), 32, 4, 2880), 64),
            128, 2),
        0, kGptOss, "", kGptOssApprox}},
      // DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437), sec. 2.1 and 4.2:
      // 61 layers of 7168, the first 3 dense (18432), 256 routed experts of 2048 + 1 shared,
      // top 8. Its multi-head latent attention is not loom's: the deepseek-v3-gqa preset puts
      // 128 full heads of 56 in its place. MLA's projections (q 7168 x 1536 x 24576, kv 7168 x
      // 576 and 512 x 32768, o 16384 x 7168: 187M per layer) are within 10% of the stand-in's 4
      // x 7168^2 = 206M, so the parameters (about 671B, 37B active) and GEMM FLOPs hold; its
      // attention core (q.k over 192 wide heads, p.v over 128) is about 2.9x the stand-in's, some
      // 8% of a token's FLOPs at 4K.
      // It trains with one multi-token-prediction depth (sec. 2.2 and 4.2: D = 1), as
      // Megatron-Bridge's DeepSeek-V3 recipe does (mtp_num_layers 1, on the last pipeline stage
      // with the loss): one more MoE layer and one more pass of the shared head.
      {"deepseekv3",
       671,
       {"DeepSeek-V3 671B",
        [] {
          ModelConfig c = model_preset("deepseek-v3-gqa");
          c.mtp_layers = 1;
          return c;
        }(),
        0, "DeepSeek-V3 Technical Report, sec. 2.2 and 4.2", "",
        "multi-head latent attention approximated by 128 full heads of 56 (parameters within 10%, "
        "attention core about a third of MLA's FLOPs)"},
       // One size, so the name alone ("DeepSeekV3", Megatron-Bridge's tables) is enough where
       // it gives no size (a size decides below) and is not an architecture string of another
       // model (Kimi K2's and Moonlight's config.json say DeepseekV3ForCausalLM).
       R"(^(?!.*([0-9]\s*b(?![a-z0-9])|kimi|moonlight|forcausal)).*deepseek[\s_-]*v3)"},
      // Kimi K2 (moonshotai/Kimi-K2-Base config.json, DeepseekV3ForCausalLM; Kimi Team 2025,
      // arXiv 2507.20534, Table 2): 61 layers of 7168, the first dense (18432), 384 routed
      // experts of 2048 + 1 shared, top 8, sigmoid routing, vocabulary 163,840 untied, 4K
      // pre-training context. MLA with 64 heads (q_lora 1536, kv_lora 512, qk 128 + 64 rope, v
      // 128): q 7168 x 1536 + 1536 x 12288, kv 7168 x 576 + 512 x 16384, o 8192 x 7168 = 101M
      // a layer, stood in for by 64 full heads of 56 (4 x 7168 x 3584 = 103M), so the
      // parameters (1.026T, 32.9B active) and GEMM FLOPs hold; MLA's attention core (q.k over
      // 192 wide heads, p.v over 128) is 2.9x the stand-in's.
      {"kimi",
       1026,
       {"Kimi K2 1T",
        [] {
          ModelConfig c = model_preset("deepseek-v3-gqa");
          c.n_head = c.n_kv_head = 64;
          c.attention_head_dim = 56;
          c.n_experts = 384;
          c.moe_first_dense = 1;
          c.vocab_size = 163840;
          return c;
        }(),
        0, "Kimi-K2-Base config.json (moonshotai, 2025); Kimi Team 2025, Table 2", "",
        "multi-head latent attention approximated by 64 full heads of 56 (parameters within 3%, "
        "attention core about a third of MLA's FLOPs)"},
       R"(k2)"},
      // Jiang et al. 2024, 'Mixtral of Experts' (arXiv 2401.04088), Table 1: 32 layers of 4096,
      // 32 heads, 8 key/value heads, experts of 14336, 8 experts, top 2, 32,000-token vocabulary;
      // Mixtral 8x22B from its released config.json: 56 layers of 6144, 48 heads, 8 kv, experts
      // of 16384, vocabulary 32,768.
      {"mixtral",
       7,
       {"Mixtral 8x7B", moe_shape(llama_shape(32, 4096, 32, 8, 14336, 32000, 32768), 8, 2), 0,
        "Jiang et al. 2024, Table 1", "", ""}},
      {"mixtral",
       22,
       {"Mixtral 8x22B", moe_shape(llama_shape(56, 6144, 48, 8, 16384, 32768, 65536), 8, 2), 0,
        "Mixtral 8x22B config.json (mistralai, 2024)", "", ""}},
      // Jiang et al. 2023, 'Mistral 7B' (arXiv 2310.06825), Table 1: 32 layers of 4096, 32
      // heads, 8 kv heads, hidden 14336, vocabulary 32,000, a 4096-key sliding window on every
      // layer, context 8192.
      {"mistral",
       7,
       {"Mistral 7B", windowed(llama_shape(32, 4096, 32, 8, 14336, 32000, 8192), 4096, 0), 0,
        "Jiang et al. 2023, Table 1", "", ""}},
      // Mistral NeMo 12B (mistralai/Mistral-Nemo-Base-2407 config.json): 40 layers of 5120, 32
      // heads of 128 (4096 wide), 8 kv heads, 14336, vocabulary 131,072, no window.
      {"mistral",
       12,
       {"Mistral NeMo 12B", heads_of(llama_shape(40, 5120, 32, 8, 14336, 131072, 131072), 128), 0,
        "Mistral-Nemo-Base-2407 config.json (mistralai, 2024)", "", ""}},
      // Qwen3 (its q/k RMSNorms, 2 x 128 weights a layer, are not counted): dense sizes, then the
      // mixtures of 128 experts, top 8, no shared experts, every layer a mixture. The report:
      // 30.5B total / 3.3B active, 235B / 22B.
      {"qwen3",
       0.6,
       {"Qwen3 0.6B", tied(heads_of(llama_shape(28, 1024, 16, 8, 3072, 151936, 32768), 128)), 0,
        kQwen3, "", ""}},
      {"qwen3",
       1.7,
       {"Qwen3 1.7B", tied(heads_of(llama_shape(28, 2048, 16, 8, 6144, 151936, 32768), 128)), 0,
        kQwen3, "", ""}},
      {"qwen3",
       4,
       {"Qwen3 4B", tied(heads_of(llama_shape(36, 2560, 32, 8, 9728, 151936, 32768), 128)), 0,
        kQwen3, "", ""}},
      {"qwen3",
       8,
       {"Qwen3 8B", heads_of(llama_shape(36, 4096, 32, 8, 12288, 151936, 32768), 128), 0, kQwen3,
        "", ""}},
      {"qwen3",
       14,
       {"Qwen3 14B", heads_of(llama_shape(40, 5120, 40, 8, 17408, 151936, 32768), 128), 0, kQwen3,
        "", ""}},
      {"qwen3",
       32,
       {"Qwen3 32B", heads_of(llama_shape(64, 5120, 64, 8, 25600, 151936, 32768), 128), 0, kQwen3,
        "", ""}},
      {"qwen3",
       30,
       {"Qwen3 30B-A3B",
        heads_of(experts_of(llama_shape(48, 2048, 32, 4, 6144, 151936, 32768), 128, 8, 768), 128),
        0, kQwen3, "", ""}},
      {"qwen3",
       235,
       {"Qwen3 235B-A22B",
        heads_of(experts_of(llama_shape(94, 4096, 64, 4, 12288, 151936, 32768), 128, 8, 1536), 128),
        0, kQwen3, "", ""}},
      // Gemma 2 and 3 (GeGLU, tied embeddings, heads of their own width): Gemma 2 alternates a
      // 4096-key window (layer 0) with global layers; Gemma 3 has five windowed layers (512 keys
      // on 1B, 1024 above) to one global.
      {"gemma2",
       2,
       {"Gemma 2 2B",
        tied(windowed(heads_of(llama_shape(26, 2304, 8, 4, 9216, 256000, 8192), 256), 4096, 2)), 0,
        kGemma2, "", kGemmaApprox}},
      {"gemma2",
       9,
       {"Gemma 2 9B",
        tied(windowed(heads_of(llama_shape(42, 3584, 16, 8, 14336, 256000, 8192), 256), 4096, 2)),
        0, kGemma2, "", kGemmaApprox}},
      {"gemma2",
       27,
       {"Gemma 2 27B",
        tied(windowed(heads_of(llama_shape(46, 4608, 32, 16, 36864, 256000, 8192), 128), 4096, 2)),
        0, kGemma2, "", kGemmaApprox}},
      {"gemma3",
       1,
       {"Gemma 3 1B",
        tied(windowed(heads_of(llama_shape(26, 1152, 4, 1, 6912, 262144, 32768), 256), 512, 6)), 0,
        kGemma3, "", kGemmaApprox}},
      {"gemma3",
       4,
       {"Gemma 3 4B",
        tied(windowed(heads_of(llama_shape(34, 2560, 8, 4, 10240, 262208, 131072), 256), 1024, 6)),
        0, kGemma3, "", kGemmaApprox}},
      {"gemma3",
       12,
       {"Gemma 3 12B",
        tied(windowed(heads_of(llama_shape(48, 3840, 16, 8, 15360, 262208, 131072), 256), 1024, 6)),
        0, kGemma3, "", kGemmaApprox}},
      {"gemma3",
       27,
       {"Gemma 3 27B",
        tied(
            windowed(heads_of(llama_shape(62, 5376, 32, 16, 21504, 262208, 131072), 128), 1024, 6)),
        0, kGemma3, "", kGemmaApprox}},
      // Nemotron-3 8B and 22B (NeMo 24.07's "Nemotron-8B" and "Nemotron-22B"): multi-head
      // attention, a squared-ReLU MLP of 4h, vocabulary 256,000, untied, sequence 4096.
      {"nemotron4",
       8,
       {"Nemotron-3 8B", llama_shape(32, 4096, 32, 32, 10923, 256000, 4096), 0, kNemotron3, "",
        "its squared-ReLU MLP of 16384 charged as a SwiGLU of 10923 (the same parameters and FLOPs "
        "to "
        "0.002%)"}},
      {"nemotron4",
       22,
       {"Nemotron-3 22B", llama_shape(40, 6144, 48, 48, 16384, 256000, 4096), 0, kNemotron3, "",
        "its squared-ReLU MLP of 24576 charged as a SwiGLU of 16384 (the same parameters and "
        "FLOPs)"}},
      // Llama 4 (text): 48 layers of 5120, 40 heads, 8 kv, experts and one shared expert of
      // 8192, top 1, vocabulary 202,048, untied. Scout: 16 experts on every layer (109B, 17B
      // active); Maverick: 128 experts on the odd layers, dense MLPs of 16384 between (400B, 17B).
      {"llama4",
       109,
       {"Llama 4 Scout 17B-16E",
        shared_experts(experts_of(llama_shape(48, 5120, 40, 8, 16384, 202048, 8192), 16, 1, 8192),
                       1, 0, 1),
        0, kLlama4, "", kLlama4Approx},
       R"(scout|16e|e16)"},
      {"llama4",
       400,
       {"Llama 4 Maverick 17B-128E",
        shared_experts(experts_of(llama_shape(48, 5120, 40, 8, 16384, 202048, 8192), 128, 1, 8192),
                       1, 1, 2),
        0, kLlama4, "", kLlama4Approx},
       R"(maverick|128e|e128)"},
      // Nemotron-4: a squared-ReLU MLP of 4h (two matrices), charged as a SwiGLU of 2/3 of it
      // (the same parameters and FLOPs); untied, vocabulary 256,000, sequence 4096. 15B: 32
      // layers of 6144, 48 heads, 8 kv; 340B: 96 layers of 18432, 96 heads of 192, 8 kv.
      {"nemotron4",
       15,
       {"Nemotron-4 15B", llama_shape(32, 6144, 48, 8, 16384, 256000, 4096), 0, kNemotron4, "",
        "its squared-ReLU MLP of 24576 charged as a SwiGLU of 16384 (the same parameters and "
        "FLOPs)"}},
      {"nemotron4",
       340,
       {"Nemotron-4 340B", llama_shape(96, 18432, 96, 8, 49152, 256000, 4096), 0, kNemotron4, "",
        "its squared-ReLU MLP of 73728 charged as a SwiGLU of 49152 (the same parameters and "
        "FLOPs)"}},
      // Llama 3.2 1B and 3B (the released config.json): 16 layers of 2048 and 28 of 3072, 8 kv
      // heads, hidden 8192, tied embeddings.
      {"llama3",
       1,
       {"Llama 3.2 1B", tied(llama_shape(16, 2048, 32, 8, 8192, 128256, 8192)), 0, kLlama32, "",
        ""}},
      {"llama3",
       3,
       {"Llama 3.2 3B", tied(llama_shape(28, 3072, 24, 8, 8192, 128256, 8192)), 0, kLlama32, "",
        ""}},
      // Qwen2.5 (Qwen Team 2024, arXiv 2412.15115, Table 1, and the released config.json files):
      // layers, hidden, heads / kv heads, intermediate width; vocabulary 152,064 (the q/k/v
      // biases are not counted).
      {"qwen2",
       7,
       {"Qwen2.5 7B", llama_shape(28, 3584, 28, 4, 18944, 152064, 32768), 0, kQwen25, "", ""}},
      {"qwen2",
       14,
       {"Qwen2.5 14B", llama_shape(48, 5120, 40, 8, 13824, 152064, 32768), 0, kQwen25, "", ""}},
      {"qwen2",
       32,
       {"Qwen2.5 32B", llama_shape(64, 5120, 40, 8, 27648, 152064, 32768), 0, kQwen25, "", ""}},
      {"qwen2",
       72,
       {"Qwen2.5 72B", llama_shape(80, 8192, 64, 8, 29568, 152064, 32768), 0, kQwen25, "", ""}},
  };
  return all;
}

}  // namespace published_model_table

namespace {

std::string normalised(const std::string& text) {
  std::string out;
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The family a printed name belongs to, or "" when none is known.
std::string family_of(const std::string& name) {
  static const std::vector<std::pair<std::regex, const char*>> families = {
      // Before Llama's: Code Llama is Llama 2's shapes with its own vocabulary and context.
      {std::regex(R"(code[\s_-]*llama)"), "codellama"},
      {std::regex(R"(llama[\s_-]*4(?![0-9]))"), "llama4"},
      {std::regex(R"(llama[\s_-]*3(?![0-9]))"), "llama3"},
      {std::regex(R"(llama[\s_-]*2(?![0-9]))"), "llama2"},
      {std::regex(R"(llama)"), "llama1"},
      {std::regex(R"(gpt[\s_-]*oss)"), "gptoss"},
      {std::regex(R"(gpt[\s_-]*3(?![0-9]))"), "gpt3"},
      {std::regex(R"(deepseek[\s_-]*v3)"), "deepseekv3"},
      {std::regex(R"(mixtral)"), "mixtral"},
      // Not Kimi-Dev-72B, a Qwen2.5-72B fine-tune (its name says so and reads as Qwen's).
      {std::regex(R"(kimi(?![\s_-]*dev))"), "kimi"},
      {std::regex(R"(mistral)"), "mistral"},
      {std::regex(R"(qwen[\s_-]*2)"), "qwen2"},
      {std::regex(R"(qwen[\s_-]*3(?![0-9]))"), "qwen3"},
      // Not Gemma 1's "Gemma 2B" / "gemma-7b": the version is a digit not followed by a size.
      {std::regex(R"(gemma[\s_-]*2(?![0-9]|\s*b\b))"), "gemma2"},
      {std::regex(R"(gemma[\s_-]*3(?![0-9]|\s*b\b))"), "gemma3"},
      // Not Nemotron-H, Nemotron 3 Nano / Super / Ultra or 3.5 (hybrid Mamba models:
      // "nemotron_3_nano", "Nemotron V3 Super 120B"); "Nemotron-3 8B" (dense, 2023) and
      // "nemotron-340b" are this family's.
      {std::regex(
           R"(nemotron(?![\s_-]*(h([\s_-]|$|[0-9])|v?[35][\s_.-]*(nano|super|ultra|lightning|5)))(?!.*(^|[^a-z])(nano|super|ultra|lightning)([^a-z]|$)))"),
       "nemotron4"},
      {std::regex(R"(nemotron)"), "nemotronhybrid"},
      // published_models_more.cpp's families.
      {std::regex(R"((^|[^a-z])opt(?![a-z]))"), "opt"},
      {std::regex(R"(bloomberg)"), "bloomberggpt"},
      {std::regex(R"(bloom)"), "bloom"},
      {std::regex(R"(gpt[\s_-]*neo[\s_-]*x)"), "gptneox"},
      {std::regex(R"(gpt[\s_-]*j(?![a-z]))"), "gptj"},
      // Megatron-LM's models before GPT-2's, which their names cite ("Megatron-LM GPT-2 8.3B");
      // not Megatron-BERT.
      {std::regex(R"(mt[\s_-]*nlg|megatron[\s_-]*turing)"), "mtnlg"},
      {std::regex(R"(turing[\s_-]*nlg|(^|[^a-z])t[\s_-]*nlg)"), "turingnlg"},
      {std::regex(R"(megatron(?![\s_-]*bert))"), "megatronlm"},
      {std::regex(R"(gpt[\s_-]*2(?![0-9]))"), "gpt2"},
      // Not Falcon 2 / 3, Falcon-Mamba, Falcon-H1 or Falcon-E: other architectures.
      {std::regex(R"(falcon(?![\s_-]*(2|3|mamba|h1|e\b)))"), "falcon"},
      {std::regex(R"(pythia)"), "pythia"},
      {std::regex(R"(deepseek[\s_-]*moe)"), "deepseekmoe"},
      {std::regex(R"(deepseek[\s_-]*v2)"), "deepseekv2"},  // V2, V2.5 and V2-Lite
      {std::regex(R"(deepseek(?![\s_-]*(v[0-9]|coder|r1|math|vl|prover)))"), "deepseekllm"},
      {std::regex(R"((^|[^a-z])yi(?![a-z]))"), "yi"},
      {std::regex(R"(dbrx)"), "dbrx"},
      {std::regex(R"(grok[\s_-]*1(?![0-9.]))"), "grok1"},
      {std::regex(R"((^|[^a-z])glm[\s_-]*130)"), "glm130"},
      {std::regex(R"(starcoder[\s_-]*2)"), "starcoder2"},
      {std::regex(R"(starcoder)"), "starcoder"},
      {std::regex(R"((^|[^a-z])mpt(?![a-z]))"), "mpt"},
      {std::regex(R"(olmo[\s_-]*2(?![0-9]))"), "olmo2"},
      {std::regex(R"(olmo(?!e))"), "olmo"},  // not OLMoE, a mixture of experts
      {std::regex(R"(apertus)"), "apertus"},
  };
  for (const auto& [pattern, family] : families)
    if (std::regex_search(name, pattern)) return family;
  return "";
}

}  // namespace

std::string published_family(const std::string& printed_name) {
  return family_of(normalised(printed_name));
}

namespace {

std::optional<PublishedModel> find_by_name(const std::string& name) {
  using published_model_table::Entry;
  const std::string family = family_of(name);
  if (family.empty()) return std::nullopt;
  const std::vector<Entry>* tables[] = {&published_model_table::recent_entries(),
                                        &published_model_table::more_entries(),
                                        &published_model_table::hybrid_entries()};
  // The size: the first number followed by "b" that is not part of the family's version
  // ("Llama 3.1 8B" -> 8, "GPT3-5B" -> 5, "DeepSeek-V3 671B (37B active)" -> 671).
  static const std::regex size(R"((^|[^0-9.])([0-9]+(\.[0-9]+)?)\s*b(?![a-z0-9]))");
  std::smatch match;
  const bool sized = std::regex_search(name, match, size);
  const double size_b = sized ? std::stod(match[2].str()) : 0;
  auto same_size = [&](const Entry& e) {
    return std::abs(size_b - e.size_b) < (e.size_b < 2 ? 0.05 : 0.5);
  };
  // A variant_only entry needs its variant, and the stated size if any ("Nemotron Super 49B",
  // Llama-based, is not Nemotron 3 Super 120B).
  for (const std::vector<Entry>* table : tables)
    for (const Entry& e : *table)
      if (family == e.family && e.variant != nullptr &&
          std::regex_search(name, std::regex(e.variant)) &&
          (!e.variant_only || !sized || same_size(e)))
        return e.model;
  if (!sized) return std::nullopt;
  for (const std::vector<Entry>* table : tables)
    for (const Entry& e : *table)
      if (family == e.family && !e.variant_only && same_size(e)) return e.model;
  return std::nullopt;
}

}  // namespace

std::optional<PublishedModel> find_published_model(const std::string& printed_name) {
  const std::string name = normalised(printed_name);
  std::optional<PublishedModel> found = find_by_name(name);
  // A model trained with multi-token prediction (DeepSeek-V3) keeps its MTP depths unless the
  // name drops them ("DeepSeekV3 (w/o MTP)", Megatron-Bridge's 25.11 table).
  static const std::regex without_mtp(R"((^|[^a-z])(w/\s*o|without|no)[\s_-]*mtp)");
  if (found && found->config.mtp_layers > 0 && std::regex_search(name, without_mtp)) {
    found->config.mtp_layers = 0;
    found->approximation += std::string(found->approximation.empty() ? "" : "; ") +
                            "without its multi-token prediction (the name says so)";
  }
  return found;
}

}  // namespace loom::plan
