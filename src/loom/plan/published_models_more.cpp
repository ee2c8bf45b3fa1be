// The second table of published architectures: the GPU-trained models of 2019-24's papers and
// open releases that published runs name without their dimensions (OPT, BLOOM, GPT-NeoX,
// MT-NLG, Falcon, Pythia, DeepSeek LLM, ...). Each entry cites its paper table or released
// config; where loom's two layer kinds hold a model only approximately, the entry says how.
//
// Layer kinds: GPT's (LayerNorm, a 2-matrix MLP of 4h, multi-head attention) and Llama's
// (RMSNorm, a 3-matrix gated MLP, grouped-query attention). ReLU and GELU MLPs cost the same;
// ALiBi and rotary positions have no parameters (GPT's layer counts learned position
// embeddings, under 0.05% of these models); parallel attention and MLP (GPT-J, GPT-NeoX,
// Falcon) runs the same GEMMs. A 2-matrix MLP of width F beside multi- or grouped-query
// attention (Falcon, StarCoder) is charged as a gated one of 2F/3: the same parameters and GEMM
// FLOPs (3 h 2F/3 = 2 h F).
#include "loom/plan/published_model_shapes.hpp"

namespace loom::plan::published_model_table {

namespace {

ModelConfig untied(ModelConfig c) {
  c.tied_embeddings = false;
  return c;
}

// A 2-matrix MLP of `ffn` beside fewer key/value heads than query heads, as a gated MLP.
ModelConfig query_grouped_gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads,
                              int64_t ffn, int64_t vocab, int64_t seq) {
  return llama_shape(layers, hidden, heads, kv_heads, (2 * ffn + 1) / 3, vocab, seq);
}

const char* const kTwoMatrixAsGated =
    "its 2-matrix GELU MLP charged as a gated MLP of 2/3 its width (the same parameters and "
    "FLOPs)";

// A size named in millions ("OPT-125M", "pythia-70m"): the number not inside another.
#define LOOM_MILLIONS(n) "(^|[^0-9.])" #n "\\s*m(?![a-z0-9])"

const char* const kOpt =
    "Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models' (arXiv 2205.01068), "
    "Table 1 (layers, heads, d_model, batch in tokens); vocabulary 50,272 from the released "
    "config.json";
const char* const kBloom =
    "BigScience 2022, 'BLOOM: A 176B-Parameter Open-Access Multilingual Language Model' (arXiv "
    "2211.05100), Table 3; vocabulary 250,880 from the released config.json";
const char* const kPythia =
    "Biderman et al. 2023, 'Pythia: A Suite for Analyzing Large Language Models' (arXiv "
    "2304.01373), Table 1 (2M-token batch, 1024 x 2048); vocabularies from the released "
    "config.json files";
const char* const kDeepSeekLlm =
    "DeepSeek-AI 2024, 'DeepSeek LLM: Scaling Open-Source Language Models with Longtermism' "
    "(arXiv 2401.02954), Table 2";
const char* const kCodeLlama =
    "Roziere et al. 2023, 'Code Llama: Open Foundation Models for Code' (arXiv 2308.12950); the "
    "released config.json files (vocabulary 32,016 with the infilling tokens)";
const char* const kStarCoder2 =
    "Lozhkov et al. 2024, 'StarCoder 2 and The Stack v2' (arXiv 2402.19173), Table 5; "
    "config.json (untied; pre-trained at 4096 tokens, then 16,384)";
const char* const kOlmo =
    "Groeneveld et al. 2024, 'OLMo: Accelerating the Science of Language Models' (arXiv "
    "2402.00838), Table 1; config.json (vocabulary padded to 50,304)";
const char* const kOlmo2 =
    "OLMo Team 2024, '2 OLMo 2 Furious' (arXiv 2501.00656), Table 1 (batches of 1024 and 2048 "
    "sequences of 4096); config.json";
const char* const kApertus =
    "Swiss AI 2025, Apertus v1 Technical Report (arXiv 2509.14233), Table 1; "
    "swiss-ai/pretrain-code "
    "pretraining/submit_apertus_70b.sh and submit_apertus_8b.sh";
const char* const kXielu =
    "xIELU's 2-matrix MLP of F charged as a SwiGLU of 2F/3 (the same parameters, FLOPs and saved "
    "bytes)";
const char* const kGpt2 =
    "Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', Table 2; the "
    "released checkpoints (vocabulary 50,257, context 1024)";

}  // namespace

const std::vector<Entry>& more_entries() {
  static const std::vector<Entry> all = {
      // OPT: GPT's layer with ReLU, tied embeddings, learned positions; 2048-token context.
      {"opt",
       0.125,
       {"OPT 125M", gpt_shape(12, 768, 12, 50272, 2048), 1 << 19, kOpt, "", ""},
       LOOM_MILLIONS(125)},
      {"opt",
       0.35,
       {"OPT 350M", gpt_shape(24, 1024, 16, 50272, 2048), 1 << 19, kOpt, "", ""},
       LOOM_MILLIONS(350)},
      {"opt", 1.3, {"OPT 1.3B", gpt_shape(24, 2048, 32, 50272, 2048), 1 << 20, kOpt, "", ""}},
      {"opt", 2.7, {"OPT 2.7B", gpt_shape(32, 2560, 32, 50272, 2048), 1 << 20, kOpt, "", ""}},
      {"opt", 6.7, {"OPT 6.7B", gpt_shape(32, 4096, 32, 50272, 2048), 2 << 20, kOpt, "", ""}},
      {"opt", 13, {"OPT 13B", gpt_shape(40, 5120, 40, 50272, 2048), 4 << 20, kOpt, "", ""}},
      {"opt", 30, {"OPT 30B", gpt_shape(48, 7168, 56, 50272, 2048), 4 << 20, kOpt, "", ""}},
      {"opt", 66, {"OPT 66B", gpt_shape(64, 9216, 72, 50272, 2048), 2 << 20, kOpt, "", ""}},
      {"opt", 175, {"OPT 175B", gpt_shape(96, 12288, 96, 50272, 2048), 2 << 20, kOpt, "", ""}},
      // BLOOM: GPT's layer with ALiBi, tied embeddings, the vocabulary padded to 250,880; batches
      // of 256 to 2048 sequences (bigscience-workshop/bigscience train/tr11-176B-ml/*.slurm).
      {"bloom",
       0.56,
       {"BLOOM 560M", gpt_shape(24, 1024, 16, 250880, 2048), 256 * 2048, kBloom, "", ""},
       LOOM_MILLIONS(560)},
      {"bloom",
       1.1,
       {"BLOOM 1B1", gpt_shape(24, 1536, 16, 250880, 2048), 256 * 2048, kBloom, "", ""},
       R"(1b1)"},
      {"bloom",
       1.7,
       {"BLOOM 1B7", gpt_shape(24, 2048, 16, 250880, 2048), 512 * 2048, kBloom, "", ""},
       R"(1b7)"},
      {"bloom", 3, {"BLOOM 3B", gpt_shape(30, 2560, 32, 250880, 2048), 512 * 2048, kBloom, "", ""}},
      {"bloom",
       7.1,
       {"BLOOM 7B1", gpt_shape(30, 4096, 32, 250880, 2048), 512 * 2048, kBloom, "", ""},
       R"(7b1)"},
      {"bloom",
       176,
       {"BLOOM 176B", gpt_shape(70, 14336, 112, 250880, 2048), 2048 * 2048, kBloom, "", ""}},
      // Black et al. 2022, 'GPT-NeoX-20B' (arXiv 2204.06745), Table 1: 44 layers of 6144, 64
      // heads, untied embeddings, 50,432-token vocabulary; its configs/20B.yml batch of 1536
      // sequences of 2048 (4 x 32 x dp 12; the paper's ~3.15M tokens).
      {"gptneox",
       20,
       {"GPT-NeoX 20B", untied(gpt_shape(44, 6144, 64, 50432, 2048)), 1536 * 2048,
        "Black et al. 2022, 'GPT-NeoX-20B' (arXiv 2204.06745), Table 1", "", ""}},
      // Wang and Komatsuzaki 2021, GPT-J 6B (kingoflolz/mesh-transformer-jax
      // configs/6B_roto_256.json): 28 layers of 4096, 16 heads, vocabulary 50,400, untied; 512
      // sequences a batch.
      {"gptj",
       6,
       {"GPT-J 6B", untied(gpt_shape(28, 4096, 16, 50400, 2048)), 512 * 2048,
        "EleutherAI/gpt-j-6b config.json (mesh-transformer-jax)", "", ""}},
      {"gpt2",
       1.5,
       {"GPT-2 1.5B", gpt_shape(48, 1600, 25, 50257, 1024), 0, kGpt2, "", ""},
       R"(xl)"},
      {"gpt2",
       0.774,
       {"GPT-2 774M", gpt_shape(36, 1280, 20, 50257, 1024), 0, kGpt2, "", ""},
       R"(large|774\s*m)"},
      {"gpt2",
       0.355,
       {"GPT-2 355M", gpt_shape(24, 1024, 16, 50257, 1024), 0, kGpt2, "", ""},
       R"(medium|345\s*m|355\s*m)"},
      {"gpt2",
       0.124,
       {"GPT-2 124M", gpt_shape(12, 768, 12, 50257, 1024), 0, kGpt2, "", ""},
       R"(small|117\s*m|124\s*m)"},
      // Smith et al. 2022, 'Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B'
      // (arXiv 2201.11990), sec. 3.1: 105 layers of 20480, 128 heads, sequence 2048, batch 1920
      // sequences; the paper gives no vocabulary: GPT-2's BPE padded to 51,200 as Megatron-LM
      // pads it for tp 8 is assumed.
      {"mtnlg",
       530,
       {"MT-NLG 530B", gpt_shape(105, 20480, 128, 51200, 2048), 1920 * 2048,
        "Smith et al. 2022 (arXiv 2201.11990), sec. 3.1", "", ""},
       R"(.)"},  // the one size
      // Shoeybi et al. 2019, 'Megatron-LM' (arXiv 1909.08053), Table 2: 1.2B (40 x 1536, 16
      // heads), 2.5B (54 x 1920, 20), 4.2B (48 x 2304, 24), 8.3B (72 x 3072, 32); context 1024,
      // batch 512, the 51,200-token padded vocabulary.
      {"megatronlm",
       1.2,
       {"Megatron-LM 1.2B", gpt_shape(40, 1536, 16, 51200, 1024), 512 * 1024,
        "Shoeybi et al. 2019, Table 2", "", ""}},
      {"megatronlm",
       2.5,
       {"Megatron-LM 2.5B", gpt_shape(54, 1920, 20, 51200, 1024), 512 * 1024,
        "Shoeybi et al. 2019, Table 2", "", ""}},
      {"megatronlm",
       4.2,
       {"Megatron-LM 4.2B", gpt_shape(48, 2304, 24, 51200, 1024), 512 * 1024,
        "Shoeybi et al. 2019, Table 2", "", ""}},
      {"megatronlm",
       8.3,
       {"Megatron-LM 8.3B", gpt_shape(72, 3072, 32, 51200, 1024), 512 * 1024,
        "Shoeybi et al. 2019, Table 2", "", ""}},
      // Microsoft 2020, 'Turing-NLG: A 17-billion-parameter language model by Microsoft' (blog):
      // 78 layers of 4256, 28 heads; the blog states neither context nor vocabulary: GPT-2's
      // (1024, 50,257) assumed.
      {"turingnlg",
       17,
       {"Turing-NLG 17B", gpt_shape(78, 4256, 28, 50257, 1024), 512 * 1024,
        "Microsoft Research blog, Feb. 2020", "", ""}},
      // Almazrouei et al. 2023, 'The Falcon Series of Open Language Models' (arXiv 2311.16867),
      // Table 1 and the released config.json files: multi-query (7B) and 8-group (40B, 180B)
      // attention, heads of 64, a 2-matrix GELU MLP of 4h, vocabulary 65,024, tied embeddings,
      // context 2048; batches of 2304, 1152 and 2048 sequences (the model cards).
      {"falcon",
       7,
       {"Falcon 7B", tied(query_grouped_gpt(32, 4544, 71, 1, 18176, 65024, 2048)), 2304 * 2048,
        "Almazrouei et al. 2023, Table 1; tiiuae/falcon-7b config.json", "", kTwoMatrixAsGated}},
      {"falcon",
       40,
       {"Falcon 40B", tied(query_grouped_gpt(60, 8192, 128, 8, 32768, 65024, 2048)), 1152 * 2048,
        "Almazrouei et al. 2023, Table 1; tiiuae/falcon-40b config.json", "", kTwoMatrixAsGated}},
      {"falcon",
       180,
       {"Falcon 180B", tied(query_grouped_gpt(80, 14848, 232, 8, 59392, 65024, 2048)), 2048 * 2048,
        "Almazrouei et al. 2023, Table 1; tiiuae/falcon-180B config.json", "", kTwoMatrixAsGated}},
      // Pythia: GPT-NeoX's layer, untied embeddings.
      {"pythia",
       0.07,
       {"Pythia 70M", untied(gpt_shape(6, 512, 8, 50304, 2048)), 1024 * 2048, kPythia, "", ""},
       LOOM_MILLIONS(70)},
      {"pythia",
       0.16,
       {"Pythia 160M", untied(gpt_shape(12, 768, 12, 50304, 2048)), 1024 * 2048, kPythia, "", ""},
       LOOM_MILLIONS(160)},
      {"pythia",
       0.41,
       {"Pythia 410M", untied(gpt_shape(24, 1024, 16, 50304, 2048)), 1024 * 2048, kPythia, "", ""},
       LOOM_MILLIONS(410)},
      {"pythia",
       1,
       {"Pythia 1B", untied(gpt_shape(16, 2048, 8, 50304, 2048)), 1024 * 2048, kPythia, "", ""}},
      {"pythia",
       1.4,
       {"Pythia 1.4B", untied(gpt_shape(24, 2048, 16, 50304, 2048)), 1024 * 2048, kPythia, "", ""}},
      {"pythia",
       2.8,
       {"Pythia 2.8B", untied(gpt_shape(32, 2560, 32, 50304, 2048)), 1024 * 2048, kPythia, "", ""}},
      {"pythia",
       6.9,
       {"Pythia 6.9B", untied(gpt_shape(32, 4096, 32, 50432, 2048)), 1024 * 2048, kPythia, "", ""}},
      {"pythia",
       12,
       {"Pythia 12B", untied(gpt_shape(36, 5120, 40, 50688, 2048)), 1024 * 2048, kPythia, "", ""}},
      // DeepSeek LLM: Llama's layer; 2304 and 4608 sequences of 4096 a batch.
      {"deepseekllm",
       7,
       {"DeepSeek LLM 7B", llama_shape(30, 4096, 32, 32, 11008, 102400, 4096), 2304 * 4096,
        kDeepSeekLlm, "", ""}},
      {"deepseekllm",
       67,
       {"DeepSeek LLM 67B", llama_shape(95, 8192, 64, 8, 22016, 102400, 4096), int64_t{4608} * 4096,
        kDeepSeekLlm, "", ""}},
      // DeepSeek-AI 2024, 'DeepSeek-V2' (arXiv 2405.04434), sec. 3.1.1 and config.json: 60
      // layers of 5120, the first dense (12288), then 160 routed experts of 1536, top 6, and 2
      // shared; vocabulary 102,400 untied; 4K pre-training context; batches ramped to 9216
      // sequences (sec. 3.1.2). MLA with 128 heads (q_lora 1536, kv_lora 512, qk 128 + 64 rope,
      // v 128): 7.9 + 37.7 + 2.9 + 16.8 + 83.9 = 149M a layer, stood in for by 128 full heads
      // of 56 (4 x 5120 x 7168 = 147M), as DeepSeek-V3's: 235.6B parameters, 21.4B active
      // (236B and 21B stated). DeepSeek-V2-Lite: 27 layers of 2048, 16 heads without q_lora
      // (2048 x 3072 + 2048 x 576 + 512 x 4096 + 2048 x 2048 = 13.9M a layer; 16 full heads of
      // 104, 13.6M), the first dense (10944), 64 routed experts of 1408, top 6, 2 shared:
      // 15.7B, 2.4B active (as stated).
      {"deepseekv2",
       16,
       {"DeepSeek-V2-Lite 16B",
        heads_of(shared_experts(
                     experts_of(llama_shape(27, 2048, 16, 16, 10944, 102400, 4096), 64, 6, 1408), 2,
                     1, 1),
                 104),
        0, "DeepSeek-AI 2024 (arXiv 2405.04434), Appendix B; DeepSeek-V2-Lite config.json", "",
        "multi-head latent attention approximated by 16 full heads of 104 (parameters within 2%)"},
       R"(lite)"},
      {"deepseekv2",
       236,
       {"DeepSeek-V2 236B",
        heads_of(shared_experts(
                     experts_of(llama_shape(60, 5120, 128, 128, 12288, 102400, 4096), 160, 6, 1536),
                     2, 1, 1),
                 56),
        int64_t{9216} * 4096,
        "DeepSeek-AI 2024 (arXiv 2405.04434), sec. 3.1; DeepSeek-V2 config.json", "",
        "multi-head latent attention approximated by 128 full heads of 56 (parameters within 2%, "
        "attention core about a third of MLA's FLOPs)"},
       R"(v2(?![\s_.-]*lite))"},
      // Dai et al. 2024, 'DeepSeekMoE' (arXiv 2401.06066), sec. 5.1 and config.json: 28 layers
      // of 2048, 16 heads, the first layer dense (10944), then 64 routed experts of 1408, top 6,
      // and 2 shared; vocabulary 102,400, context 4096.
      {"deepseekmoe",
       16,
       {"DeepSeekMoE 16B",
        shared_experts(experts_of(llama_shape(28, 2048, 16, 16, 10944, 102400, 4096), 64, 6, 1408),
                       2, 1, 1),
        0, "Dai et al. 2024 (arXiv 2401.06066), sec. 5.1; deepseek-moe-16b-base config.json", "",
        ""}},
      // 01.AI 2024, 'Yi: Open Foundation Models by 01.AI' (arXiv 2403.04652), Table 1:
      // Llama's layer with grouped-query attention, vocabulary 64,000, context 4096.
      {"yi",
       6,
       {"Yi 6B", llama_shape(32, 4096, 32, 4, 11008, 64000, 4096), 0,
        "01.AI 2024 (arXiv 2403.04652), Table 1", "", ""}},
      {"yi",
       34,
       {"Yi 34B", llama_shape(60, 7168, 56, 8, 20480, 64000, 4096), 0,
        "01.AI 2024 (arXiv 2403.04652), Table 1", "", ""}},
      // Databricks 2024, DBRX (databricks/dbrx-base config.json): 40 layers of 6144, 48 heads,
      // 8 kv heads, 16 experts of 10752, top 4, vocabulary 100,352, context 32,768.
      {"dbrx",
       132,
       {"DBRX 132B", experts_of(llama_shape(40, 6144, 48, 8, 10752, 100352, 32768), 16, 4, 10752),
        0, "databricks/dbrx-base config.json", "", ""},
       R"(dbrx)"},
      // xAI 2024, Grok-1 (xai-org/grok-1 run.py): 64 layers of 6144, 48 heads, 8 kv heads, 8
      // experts of 32768 (widening factor 8), top 2, vocabulary 131,072 tied (model.py's
      // in_out_embed), context 8192.
      {"grok1",
       314,
       {"Grok-1 314B", tied(moe_shape(llama_shape(64, 6144, 48, 8, 32768, 131072, 8192), 8, 2)), 0,
        "xai-org/grok-1 run.py", "", ""},
       R"(grok)"},
      // Zeng et al. 2022, 'GLM-130B' (arXiv 2210.02414), sec. 2 and Table 11: 70 layers of
      // 12288, 96 heads, GeGLU of 32768, vocabulary 150,528, context 2048, batch 4224.
      {"glm130",
       130,
       {"GLM-130B", llama_shape(70, 12288, 96, 96, 32768, 150528, 2048), 4224 * 2048,
        "Zeng et al. 2022 (arXiv 2210.02414), Table 11", "",
        "GeGLU charged as SwiGLU (the same 3 matrices); DeepNorm's post-norms as pre-norms"},
       R"(glm)"},
      // Wu et al. 2023, 'BloombergGPT' (arXiv 2303.17564), sec. 2.3: 70 layers of 7680, 40
      // heads, ALiBi, vocabulary 131,072, context 2048, batch 1024 sequences, then 2048.
      {"bloomberggpt",
       50,
       {"BloombergGPT 50B", gpt_shape(70, 7680, 40, 131072, 2048), 0,
        "Wu et al. 2023 (arXiv 2303.17564), sec. 2.3", "", ""},
       R"(bloomberg)"},
      // Li et al. 2023, 'StarCoder' (arXiv 2305.06161), Table 12: 40 layers of 6144, 48 heads,
      // multi-query attention, a GELU MLP of 4h, vocabulary 49,152 tied, context 8192.
      {"starcoder",
       15.5,
       {"StarCoder 15.5B", tied(query_grouped_gpt(40, 6144, 48, 1, 24576, 49152, 8192)), 512 * 8192,
        "Li et al. 2023 (arXiv 2305.06161), Table 12", "", kTwoMatrixAsGated},
       // "StarCoder", "StarCoder 15B" or "15.5B"; not StarCoderBase-1B / 3B / 7B.
       R"(^[^0-9]*$|(^|[^0-9.])15(\.5)?\s*b(?![a-z0-9]))"},
      {"starcoder2",
       3,
       {"StarCoder2 3B", query_grouped_gpt(30, 3072, 24, 2, 12288, 49152, 4096), 0, kStarCoder2, "",
        kTwoMatrixAsGated}},
      {"starcoder2",
       7,
       {"StarCoder2 7B", query_grouped_gpt(32, 4608, 36, 4, 18432, 49152, 4096), 0, kStarCoder2, "",
        kTwoMatrixAsGated}},
      {"starcoder2",
       15,
       {"StarCoder2 15B", query_grouped_gpt(40, 6144, 48, 4, 24576, 49152, 4096), 0, kStarCoder2,
        "", kTwoMatrixAsGated}},
      // Code Llama: Llama 2's layers with the infilling vocabulary (34B: none); trained on code
      // at 4096 tokens, then fine-tuned at 16,384; 34B is Llama 2's 34B.
      {"codellama",
       7,
       {"Code Llama 7B", llama_shape(32, 4096, 32, 32, 11008, 32016, 4096), 0, kCodeLlama, "", ""}},
      {"codellama",
       13,
       {"Code Llama 13B", llama_shape(40, 5120, 40, 40, 13824, 32016, 4096), 0, kCodeLlama, "",
        ""}},
      {"codellama",
       34,
       {"Code Llama 34B", llama_shape(48, 8192, 64, 8, 22016, 32000, 4096), 0, kCodeLlama, "", ""}},
      {"codellama",
       70,
       {"Code Llama 70B", llama_shape(80, 8192, 64, 8, 28672, 32016, 4096), 0, kCodeLlama, "", ""}},
      // Llama 2 34B was trained (Touvron et al. 2023, Table 1: GQA, 4k context) but not
      // released; Code Llama 34B continues it, so its layers are these.
      {"llama2",
       34,
       {"Llama 2 34B", llama_shape(48, 8192, 64, 8, 22016, 32000, 4096), 4 << 20,
        "Touvron et al. 2023 (arXiv 2307.09288), Table 1; layers from Code Llama 34B's config.json",
        "", ""}},
      // MosaicML's MPT (mosaicml/mpt-7b, mpt-30b config.json): GPT's layer with ALiBi, tied
      // embeddings, vocabulary 50,432; both pre-trained at 2048 tokens (30B's last stage at
      // 8192).
      {"mpt",
       7,
       {"MPT 7B", gpt_shape(32, 4096, 32, 50432, 2048), 0, "mosaicml/mpt-7b config.json", "", ""}},
      {"mpt",
       30,
       {"MPT 30B", gpt_shape(48, 7168, 64, 50432, 2048), 0, "mosaicml/mpt-30b config.json", "",
        ""}},
      {"olmo",
       1,
       {"OLMo 1B", tied(llama_shape(16, 2048, 16, 16, 8192, 50304, 2048)), 4 << 20, kOlmo, "", ""}},
      {"olmo",
       7,
       {"OLMo 7B", llama_shape(32, 4096, 32, 32, 11008, 50304, 2048), 4 << 20, kOlmo, "", ""}},
      {"olmo2",
       7,
       {"OLMo 2 7B", llama_shape(32, 4096, 32, 32, 11008, 100352, 4096), 4 << 20, kOlmo2, "", ""}},
      {"olmo2",
       13,
       {"OLMo 2 13B", llama_shape(40, 5120, 40, 40, 13824, 100352, 4096), 8 << 20, kOlmo2, "", ""}},
      // Swiss AI 2025, Apertus (arXiv 2509.14233, Table 1; swiss-ai/pretrain-code
      // submit_apertus_70b.sh and submit_apertus_8b.sh): 80 layers of 8192 (64 heads, 8 kv) and
      // 32 of 4096 (32 heads, 8 kv), xIELU MLPs of 43008 and 21504 (two matrices, not gated),
      // untied, vocabulary 131,072, sequences of 4096; the 70B's batch 4096 sequences after its
      // ramp from 2048.
      {"apertus",
       70,
       {"Apertus 70B", llama_shape(80, 8192, 64, 8, 43008 * 2 / 3, 131072, 4096), 4096 * 4096,
        kApertus, "", kXielu}},
      {"apertus",
       8,
       {"Apertus 8B", llama_shape(32, 4096, 32, 8, 21504 * 2 / 3, 131072, 4096), 0, kApertus, "",
        kXielu}},
  };
  return all;
}

#undef LOOM_MILLIONS

}  // namespace loom::plan::published_model_table
