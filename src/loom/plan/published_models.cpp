#include "loom/plan/published_models.hpp"

#include <cctype>
#include <cmath>
#include <regex>
#include <vector>

namespace loom::plan {

namespace {

ModelConfig llama_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                        int64_t seq) {
  ModelConfig c;
  c.arch = Architecture::Llama;
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.ffn_hidden = ffn;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.tied_embeddings = false;
  return c;
}

ModelConfig gpt_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.arch = Architecture::GPT2;
  c.n_layer = layers;
  c.n_embd = hidden;
  c.n_head = c.n_kv_head = heads;
  c.ffn_hidden = 4 * hidden;
  c.vocab_size = vocab;
  c.max_seq_len = seq;
  c.tied_embeddings = true;
  return c;
}

struct Entry {
  const char* family;  // normalised family key (see family_of)
  double size_b;       // the size as models are named ("13" for LLaMA 13B)
  PublishedModel model;
};

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

const std::vector<Entry>& entries() {
  static const std::vector<Entry> all = {
      {"llama1", 7, {"LLaMA 7B", llama_shape(32, 4096, 32, 32, 11008, 32000, 2048), 4 << 20, kLlama1, ""}},
      {"llama1", 13, {"LLaMA 13B", llama_shape(40, 5120, 40, 40, 13824, 32000, 2048), 4 << 20, kLlama1, ""}},
      // Table 2 names it 33B (32.5B parameters); the weights were first released as "30B".
      {"llama1", 30, {"LLaMA 30B/33B", llama_shape(60, 6656, 52, 52, 17920, 32000, 2048), 4 << 20, kLlama1, ""}},
      {"llama1", 33, {"LLaMA 30B/33B", llama_shape(60, 6656, 52, 52, 17920, 32000, 2048), 4 << 20, kLlama1, ""}},
      {"llama1", 65, {"LLaMA 65B", llama_shape(80, 8192, 64, 64, 22016, 32000, 2048), 4 << 20, kLlama1, ""}},
      {"llama2", 7, {"Llama 2 7B", llama_shape(32, 4096, 32, 32, 11008, 32000, 4096), 4 << 20, kLlama2, ""}},
      {"llama2", 13, {"Llama 2 13B", llama_shape(40, 5120, 40, 40, 13824, 32000, 4096), 4 << 20, kLlama2, ""}},
      {"llama2", 70, {"Llama 2 70B", llama_shape(80, 8192, 64, 8, 28672, 32000, 4096), 4 << 20, kLlama2, ""}},
      {"llama3", 8, {"Llama 3 8B", llama_shape(32, 4096, 32, 8, 14336, 128256, 8192), 0, kLlama3, ""}},
      {"llama3", 70, {"Llama 3 70B", llama_shape(80, 8192, 64, 8, 28672, 128256, 8192), 0, kLlama3, ""}},
      {"llama3", 405, {"Llama 3 405B", llama_shape(126, 16384, 128, 8, 53248, 128256, 8192), 0, kLlama3, ""}},
      // Brown et al. 2020, 'Language Models are Few-Shot Learners' (arXiv 2005.14165), Table 2.1:
      // 96 layers, d_model 12288, 96 heads of 128, context 2048, 3.2M-token batch; GPT-2's
      // 50,257-token BPE vocabulary (sec. 2.1 follows GPT-2).
      {"gpt3", 175, {"GPT-3 175B", gpt_shape(96, 12288, 96, 50257, 2048), 3200000, "Brown et al. 2020, Table 2.1", ""}},
      // NeMo's GPT-3 5B recipe (NVIDIA NeMo-Framework-Launcher, launcher_scripts/conf/training/
      // gpt3/5b.yaml): 24 layers, hidden 4096, FFN 16384, 32 heads, sequence 2048; GPT-2 BPE
      // vocabulary padded to a multiple of 128 (50,304).
      {"gpt3", 5, {"NeMo GPT-3 5B", gpt_shape(24, 4096, 32, 50304, 2048), 0, "NeMo-Framework-Launcher conf/training/gpt3/5b.yaml", ""}},
      // OpenAI 2025, 'gpt-oss-120b & gpt-oss-20b Model Card': 36 layers, residual width 2880,
      // 64 query heads of width 64 (4096 != 2880), alternating banded (128-token) and dense
      // attention, 128 experts, top-4.
      {"gptoss", 120, {"GPT-OSS 120B", ModelConfig{}, 0, "OpenAI gpt-oss model card (2025)",
                       "its 64 heads of width 64 do not divide the 2880-wide residual stream (loom's ModelConfig has "
                       "head width = hidden / heads) and half its layers use 128-token banded attention"}},
      // DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437), sec. 2.1 and 4.2.
      {"deepseekv3", 671, {"DeepSeek-V3 671B", ModelConfig{}, 0, "DeepSeek-V3 Technical Report, sec. 4.2",
                           "multi-head latent attention (compressed key/value projections) and its first three "
                           "dense layers are not in loom's ModelConfig"}},
  };
  return all;
}

std::string normalised(const std::string& text) {
  std::string out;
  for (char c : text) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The family a printed name belongs to, or "" when none is known.
std::string family_of(const std::string& name) {
  static const std::vector<std::pair<std::regex, const char*>> families = {
      {std::regex(R"(llama[\s_-]*3(?![0-9]))"), "llama3"},
      {std::regex(R"(llama[\s_-]*2(?![0-9]))"), "llama2"},
      {std::regex(R"(llama)"), "llama1"},
      {std::regex(R"(gpt[\s_-]*oss)"), "gptoss"},
      {std::regex(R"(gpt[\s_-]*3(?![0-9]))"), "gpt3"},
      {std::regex(R"(deepseek[\s_-]*v3)"), "deepseekv3"},
  };
  for (const auto& [pattern, family] : families)
    if (std::regex_search(name, pattern)) return family;
  return "";
}

}  // namespace

std::optional<PublishedModel> find_published_model(const std::string& printed_name) {
  const std::string name = normalised(printed_name);
  const std::string family = family_of(name);
  if (family.empty()) return std::nullopt;
  // The size: the first number followed by "b" that is not part of the family's version
  // ("Llama 3.1 8B" -> 8, "GPT3-5B" -> 5, "DeepSeek-V3 671B (37B active)" -> 671).
  static const std::regex size(R"((^|[^0-9.])([0-9]+(\.[0-9]+)?)\s*b\b)");
  std::smatch match;
  if (!std::regex_search(name, match, size)) return std::nullopt;
  const double size_b = std::stod(match[2].str());
  for (const Entry& e : entries())
    if (family == e.family && std::abs(size_b - e.size_b) < 0.5) return e.model;
  return std::nullopt;
}

}  // namespace loom::plan
