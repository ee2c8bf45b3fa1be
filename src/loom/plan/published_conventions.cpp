#include "loom/plan/published_conventions.hpp"

#include <algorithm>
#include <cctype>
#include <vector>

namespace loom::plan {

const char* flop_count_name(FlopCount count) {
  switch (count) {
    case FlopCount::PaLM: return "6N + 12Lhs";
    case FlopCount::RecomputeHardware: return "6N + 12Lhs + recomputed forward";
    case FlopCount::NarayananEq3: return "Narayanan eq. 3 (with recompute)";
    case FlopCount::KorthikantiModel: return "72BLsh^2(1+s/6h+V/12hL)";
    case FlopCount::KorthikantiHardware: return "72BLsh^2(1+s/3h+V/12hL)";
    case FlopCount::NonEmbeddingFull: return "6(N - Vh) + 12Lhs";
    case FlopCount::NonEmbeddingCausal: return "6(N - Vh) + 6Lhs (causal)";
  }
  return "unknown";
}

namespace {

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

struct Row {
  const char* match;  // a lowercase substring of the source text
  SourceConventions conventions;
};

SourceConventions make(const char* label, FlopCount mfu, FlopCount hfu, FlopCount tflops, bool megatron, const char* where,
                       MemoryCount memory = MemoryCount::Reserved) {
  SourceConventions c;
  c.label = label;
  c.mfu = mfu;
  c.hfu = hfu;
  c.tflops = tflops;
  c.megatron = megatron;
  c.logits_bytes_per_element = megatron ? 6 : 10;
  c.memory = memory;
  c.where = where;
  return c;
}

// Megatron-LM in 2021-22 (Narayanan et al.; Korthikanti et al., whose Table 2 counts the
// 5as/h bytes of stored scores that selective recomputation drops) and the ZeRO paper's
// DeepSpeed on V100s computed softmax(QK^T) in HBM: FlashAttention appeared in May 2022.
SourceConventions materialized(SourceConventions c) {
  c.materialized_attention = true;
  return c;
}

// Sources that predate Megatron-LM's sequence parallelism and selective recomputation
// (Korthikanti et al., May 2022: Narayanan et al. 2021, the ZeRO paper of 2020): an unstated
// sequence parallelism is off (Narayanan's Table 2 PTD-P rows name only tp and pp) and an
// unstated recomputation is none or full.
SourceConventions before_sequence_parallelism(SourceConventions c, const char* year) {
  c.unstated_sp_off = true;
  c.unstated_off_why = std::string(year) + ": sequence parallelism appeared in May 2022";
  c.before_selective_recompute = true;
  return c;
}

// A stack that trains next-token prediction alone (SourceConventions::trains_mtp).
SourceConventions no_mtp(SourceConventions c) {
  c.trains_mtp = false;
  return c;
}

// Megatron-Bridge and NeMo Automodel (2025) run Transformer Engine 2 with cuDNN 9's fused
// attention, FlashAttention-3-class on Hopper: 2x the 2023-24 rate, the top of FlashAttention-3's
// 1.5-2.0x over FlashAttention-2 (Shah et al. 2024, Fig. 5-7; cuDNN 9 matches it there).
SourceConventions fa3_class(SourceConventions c) {
  c.attention_kernel_speedup = 2.0;
  return c;
}

// NeMo's 2024 containers (24.03-24.07: Transformer Engine 1.x, cuDNN 9.0-9.1) ran attention
// through cuDNN's fused kernel, which Transformer Engine 1.x prefers over FlashAttention-2 on
// sm90, but before cuDNN's FlashAttention-3-class kernels: 1.4x the 2023-24 rate, between it
// and fa3_class's 2x. Fitted on a grid (1, 1.25, 1.3, 1.4, 1.5, 1.75, 2) against NeMo's own
// tables: the 24.07 pre-training rows (published/loom_nemo_tables.json) and the 24.03.01 "Long
// Input Sequences" table (Llama 2 7B at 4K to 1M tokens, cp up to 32, where attention is up to
// 97% of the FLOPs; published/loom_nemo_long_sequence.json): at 1x those rows came out 10% (4K)
// to 34% (1M) slow, at 1.4x -1% to -8%; docs/PLANNER.md, "NeMo's attention".
SourceConventions cudnn9_fused(SourceConventions c) {
  c.attention_kernel_speedup = 1.4;
  return c;
}

// The ZeRO paper's baseline data parallelism (Megatron-LM, 2019): every gradient fused into one
// flattened fp32 buffer for the all-reduce (its sec. 3.2, "Temporary buffers").
SourceConventions fused_allreduce_buffer(SourceConventions c) {
  c.fused_fp32_allreduce_buffer = true;
  return c;
}

// Megatron-Bridge's performance tables have a VP column in every table; "n/a" there (a null in
// a record) is no interleaving, not a choice left open.
SourceConventions vp_column(SourceConventions c) {
  c.unstated_pp_one_chunk = true;
  c.unstated_one_chunk_why = "the table's VP column: n/a is no interleaving";
  return c;
}

// Megatron-Bridge's Grace recipes offload activations (SourceConventions::
// grace_activation_offload).
SourceConventions grace_offload(SourceConventions c) {
  c.grace_activation_offload = true;
  return c;
}

// NeMo Automodel's benchmark recipes (examples/llm_benchmark/*.yaml at e45812012) build their
// models in bf16 (the model classes' initialize_weights casts to config.torch_dtype, bf16 by
// default; FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) shards those, and
// a sharded gradient takes its parameter's dtype): no fp32 copy. Every mixture-of-experts recipe
// steps torch.optim.Adam, whose moments take the parameters' dtype (bf16: 4 bytes a parameter);
// the dense Llama 3 70B one steps Transformer Engine's FusedAdam (master_weights=False, fp32
// moments by default: 8).
// The same recipes wrap every block in a checkpoint (parallelizer activation_checkpointing:
// true, ptd_checkpoint_wrapper per layer: full recomputation) in all on more than one GPU but
// gpt-oss 120B's (its 70B and 32B LoRA recipes too; the one-GPU 8B and 7B LoRA ones do not).
// The rule takes every run on more than one GPU as full, gpt-oss 120B's too (its record does not
// say; at none the planner does not fit it).
SourceConventions bf16_parameters(SourceConventions c) {
  c.bf16_parameters_no_master = true;
  c.unstated_recompute_full = true;
  return c;
}

SourceConventions tp_overlapped(SourceConventions c) {
  c.tp_comm_overlap = true;
  return c;
}

SourceConventions nemo_framework() {
  using F = FlopCount;
  return tp_overlapped(cudnn9_fused(make("NeMo 24.12-25.07", F::NonEmbeddingFull,
                                         F::RecomputeHardware, F::NonEmbeddingFull, true,
                                         "NeMo Framework user guide performance summary: "
                                         "NeMo's flop formulas, as in 24.07")));
}

// Hagemann et al. 2023's sweeps (JohannesHa/COLM-submission-efficient-parallelization-layouts):
// sequence parallelism is a separate ablation (data/seqpara/*.xlsx, the only sheets with a
// sequence-parallel column), so the main sweeps (data/*_all_runs.xlsx) ran without it; the
// layout dimensions swept are tp, pp, micro-batch, checkpointing, kernels and sequence
// parallelism, with no interleaved pipeline schedule among them. The kernel column names
// "+ RMS kernel" where the fused RMSNorm ran (the paper's RMSNorm-kernel ablation,
// reproduce_figure_rms.py); its other labels ran the norm unfused.
//
// Their models are LLaMA's layers with a 128,000-token vocabulary, not LLaMA's 32,000, and
// their MFU counts that model's N: every sheet's "Average MFU" is (6N + 12Lhs) x 4,194,304
// tokens / (GPUs x 312 TFLOP/s x "Average Step Time") with N = 14.03B, 33.8B and 66.9B for
// the sheets named 13B, 30B and 65B. Solved for the vocabulary, the 13B sheets give 128,000 at
// their lowest (128,050-129,400 at their medians, the rest the rounding of the averages), the
// 65B sheets 128,017-128,655 and the 30B ones 125,100-125,500 (a model about 0.1% smaller than
// LLaMA-33B's dimensions say). Aleph Alpha's tokenizer has 128,000 tokens.
SourceConventions hagemann_sweeps(SourceConventions c) {
  c.unstated_sp_off = true;
  c.unstated_pp_one_chunk = true;
  c.kernel_label_names_norm = true;
  c.unstated_vocab = 128000;
  c.unstated_vocab_why =
      "the sheets' MFU over their step times counts N at a 128,000-token vocabulary (13B: "
      "14.03B, 65B: 66.9B)";
  c.mfu_counts_model_params = true;
  c.dp_sync_after_backward = true;
  c.tp_reduce_per_column_linear = true;
  c.logits_gathered_over_tp = true;  // and 14 bytes a logit (GpuJob::logits_gathered_over_tp)
  c.logits_bytes_per_element = 14;
  return c;
}

SourceConventions fp8_over_fp8_peak(SourceConventions c) {
  c.fp8_mfu_over_fp8_peak = true;
  return c;
}

// torchtitan 9dec370 (the December 2024 benchmarks): train.py's loss_fn is
// cross_entropy(pred.flatten(0, 1).float(), ...) and `del pred` frees the bf16 logits before
// loss.backward(), whose log_softmax backward holds the saved fp32 log-softmax, its fp32
// incoming gradient and the fp32 gradient it writes: 12 bytes per logit at the peak (forward's
// bf16 + fp32 copy + log-softmax is 10); under tp > 1 PyTorch's loss_parallel instead, 16
// (GpuJob::logits_bytes_per_element_under_tp). selective_ac_option = "op" in its train_configs.
SourceConventions torchtitan() {
  SourceConventions c =
      make("torchtitan", FlopCount::PaLM, FlopCount::RecomputeHardware, FlopCount::PaLM, false,
           "torchtitan get_num_flop_per_token (6N + 12Lhs); memory is max_memory_reserved in GiB; "
           "selective recomputation is its per-op policy; loss buffers 12 bytes per logit, 16 "
           "under tp > 1 (loss_parallel)");
  c.logits_bytes_per_element = 12;
  c.logits_bytes_under_tp = 16;
  c.trains_mtp = false;
  c.cp_allgather_repeated_kv = true;
  c.per_op_selective = true;
  c.torchtitan_pipeline = true;
  c.fsdp_gathered_under_pp = true;
  return c;
}

SourceConventions megatron_readme() {
  return make("Megatron-LM README (H100)", FlopCount::PaLM, FlopCount::RecomputeHardware,
              FlopCount::PaLM, true,
              "Megatron-LM training.py num_floating_point_operations: 6N + 12Lhs for GPT (MFU = "
              "TFLOP/s / 989)");
}

const std::vector<Row>& rows() {
  using F = FlopCount;
  static const std::vector<Row> all = {
      {"narayanan",
       before_sequence_parallelism(
           materialized(
               make("Narayanan et al. 2021", F::PaLM, F::NarayananEq3, F::NarayananEq3, true,
                    "Narayanan et al. 2021 sec. 5.1, eq. 3: the TFLOP/s and % of peak count "
                    "the recomputed forward")),
           "2021")},
      {"korthikanti", materialized(make("Korthikanti et al. 2022", F::KorthikantiModel,
                                        F::KorthikantiHardware, F::KorthikantiModel, true,
                                        "Korthikanti et al. 2022 sec. 6.3 (model and hardware "
                                        "FLOPs); Fig. 1 sums states and activations "
                                        "by their eqs.; Table 2's 5as/h term is the stored scores",
                                        MemoryCount::StatesAndActivations))},
      {"mosaicml",
       fp8_over_fp8_peak(make("MosaicML llm-foundry", F::PaLM, F::RecomputeHardware, F::PaLM, false,
                              "llm-foundry benchmarking README: MFU (6N + 12Lds) per token, HFU "
                              "4/3 of it when checkpointing; "
                              "its H100 FP8 table's MFU is over the FP8 peak"))},
      {"rajbhandari",
       fused_allreduce_buffer(before_sequence_parallelism(
           materialized(make("ZeRO (Rajbhandari et al. 2020)", F::PaLM, F::RecomputeHardware,
                             F::PaLM, false,
                             "the ZeRO paper: Fig. 1 model states (2 + 2 + 12) Psi / Nd, GB")),
           "2020"))},
      {"hagemann",
       hagemann_sweeps(make("Hagemann et al. 2023", F::PaLM, F::RecomputeHardware, F::PaLM, false,
                            "Hagemann et al. 2023: MFU after PaLM (6N + 12Lhs)"))},
      {"llama team",
       make("Llama 3 (Meta 2024)", F::PaLM, F::RecomputeHardware, F::PaLM, false,
            "Llama 3 sec. 3.3.2 Table 4: BF16 MFU; FLOP count not given, PaLM's assumed")},
      {"megatron-bridge", grace_offload(vp_column(tp_overlapped(fa3_class(
                              make("Megatron-Bridge 25.11", F::NonEmbeddingCausal,
                                   F::RecomputeHardware, F::NonEmbeddingCausal, true,
                                   "Megatron-Bridge performance summary: model TFLOP/s from its "
                                   "flop formulas (input embedding "
                                   "not counted, causal attention halved); checked: 744 TFLOP/s / "
                                   "14,451 tokens/s = 51.5 GFLOP "
                                   "per token for Llama 3.1 8B at 8K")))))},
      {"automodel", no_mtp(bf16_parameters(fa3_class(
                        make("NeMo Automodel", F::PaLM, F::RecomputeHardware, F::PaLM, false,
                             "NeMo Automodel performance summary (MFU = TFLOP/s / 989)"))))},
      {"nvidia/nemo",
       tp_overlapped(cudnn9_fused(make("NeMo 24.07", F::NonEmbeddingFull, F::RecomputeHardware,
                                       F::NonEmbeddingFull, true,
                                       "NeMo 24.07 performance summary: model TFLOP/s from "
                                       "NeMo's flop formulas (input embedding not "
                                       "counted, attention in full); checked: 697 TFLOP/s / "
                                       "12,036 tokens/s = 57.9 GFLOP per token for "
                                       "Llama 3.1 8B at 8K")))},
      // The NeMo Framework user guide's performance summaries (NeMo 2.0 containers, 24.12 to
      // 25.07; published/loom_nemo2_tables.json): Megatron-Core under NeMo as in 24.07, the
      // same flop formulas (Llama 3 8B at 8K: 1917 TFLOP/s / 33,099 tokens/s = 57.9 GFLOP a
      // token, 24.07's figure), the same recipes' tp overlap. Attention at 24.07's 1.4x, not
      // Megatron-Bridge's 2x: over the 30 rows 11.7% median at 1.4, 17.2% at 2 (their
      // Blackwell rows, from the first Blackwell containers, run slower than the same layouts
      // under Megatron-Bridge 25.09: Llama 3 8B on 8 B200s 26,006 against 29,994 tokens/s).
      {"nemo framework", nemo_framework()},
      {"nemo-framework", nemo_framework()},
      // The README of NVIDIA/Megatron-LM (2024-25), not every paper that names Megatron-LM
      // (Shoeybi et al. 2019's title does).
      {"nvidia/megatron-lm", megatron_readme()},
      {"megatron-lm readme", megatron_readme()},
      {"torchtitan", torchtitan()},
  };
  return all;
}

}  // namespace

SourceConventions conventions_of_source(const std::string& source) {
  const std::string text = lowercase(source);
  for (const Row& row : rows())
    if (text.find(row.match) != std::string::npos) return row.conventions;
  SourceConventions other;
  const size_t cut = source.find_first_of(",(");
  other.label = source.substr(0, std::min<size_t>(cut == std::string::npos ? source.size() : cut, 40));
  while (!other.label.empty() && other.label.back() == ' ') other.label.pop_back();
  if (other.label.empty()) other.label = "other";
  other.where = "not a known source: PaLM's 6N + 12Lhs assumed";
  // A source dated 2022 or before ran what its stacks then had: FlashAttention (Dao et al.,
  // May 2022) and Megatron-LM's sequence parallelism (Korthikanti et al., May 2022) came after
  // the training of the runs that year's papers report (OPT, BLOOM, GLM-130B, MT-NLG: none uses
  // either), and their pipelines ran one model chunk per rank (DeepSpeed's pipeline engine has
  // no interleaving; Megatron's interleaved schedule, Narayanan et al. 2021, is that source's
  // own row).
  const int year = latest_year_named(source);
  const bool early = year != 0 && year <= 2022;
  other.materialized_attention = early;
  other.unstated_sp_off = early;
  other.unstated_pp_one_chunk = early;
  other.before_selective_recompute = early;
  if (early) {
    const std::string dated = "a source of " + std::to_string(year);
    other.materialized_why = dated + ": FlashAttention appeared in May 2022";
    other.unstated_off_why = dated + ": sequence parallelism appeared in May 2022";
    other.unstated_one_chunk_why = dated + ": pipelines then ran one chunk per rank";
  }
  return other;
}

int latest_year_named(const std::string& text) {
  const auto digit = [&](size_t i) { return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); };
  const auto word = [&](size_t i) { return i < text.size() && std::isalnum(static_cast<unsigned char>(text[i])); };
  int latest = 0;
  for (size_t i = 0; i + 4 <= text.size(); ++i) {
    if (text[i] != '2' || text[i + 1] != '0' || !digit(i + 2) || !digit(i + 3)) continue;
    if (i > 0 && (word(i - 1) || text[i - 1] == '.')) continue;          // inside a word or number
    if (word(i + 4) || (i + 4 < text.size() && text[i + 4] == '.' && digit(i + 5))) continue;  // 2012.01234
    const int year = 2000 + (text[i + 2] - '0') * 10 + (text[i + 3] - '0');
    if (year >= 2010 && year < 2040) latest = std::max(latest, year);
  }
  return latest;
}

double megatron_hybrid_flops_per_token(const ModelConfig& m, double seq) {
  const double h = static_cast<double>(m.n_embd), q = static_cast<double>(m.q_dim()),
               kv = static_cast<double>(m.kv_dim());
  const double scale = m.squared_relu_mlp ? 1.0 : 1.5;  // gated_linear_unit
  // Megatron-Bridge's mamba_layer_flops takes d_in = 2h whatever the heads are.
  const double d_in = 2 * h, state = static_cast<double>(m.mamba_state);
  const double mamba = 2 * h *
                           (2 * d_in + 2 * static_cast<double>(m.mamba_groups) * state +
                            static_cast<double>(m.mamba_heads)) +
                       7 * d_in * state + 2 * d_in * h;
  const double attention = 4 * h * (q + kv) + 2 * q * seq;
  const double mlp = 4 * static_cast<double>(m.ffn_hidden) * h * scale;
  const double fe = static_cast<double>(m.expert_ffn()),
               k = static_cast<double>(m.experts_per_token);
  const double latent = static_cast<double>(m.moe_latent);
  double moe =
      m.moe_latent > 0 ? 4 * latent * fe * k * scale + 4 * h * latent : 4 * h * fe * k * scale;
  moe += 4 * h * static_cast<double>(m.n_shared_experts) * fe * scale;
  // The MTP pattern's copies (here one attention and one MLP block a depth) are in the counts.
  const double mtp = static_cast<double>(m.mtp_layers);
  const double mtp_moe = m.is_moe() ? mtp : 0;
  const double forward = (static_cast<double>(m.hybrid_layer_count('*')) + mtp) * attention +
                         static_cast<double>(m.hybrid_layer_count('M')) * mamba +
                         (static_cast<double>(m.hybrid_layer_count('-')) + mtp - mtp_moe) * mlp +
                         (static_cast<double>(m.hybrid_layer_count('E')) + mtp_moe) * moe +
                         2 * h * static_cast<double>(m.vocab_size) * (1 + mtp);
  return 3 * forward;
}

double flops_per_token(FlopCount count, const ModelConfig& m, double params, double seq, Recompute recompute) {
  // A mixture of experts counts the parameters a token meets (its top-k routed experts, the
  // shared ones and the rest of the model), as every source's MoE MFU does: the stated total
  // scaled by the model's active share.
  double inactive = 0;
  if (m.is_moe()) {
    inactive = static_cast<double>(m.moe_layer_count()) * static_cast<double>(m.n_experts - m.experts_per_token) *
               static_cast<double>(m.expert_parameter_count());
    params *= 1 - inactive / static_cast<double>(m.parameter_count());
  }
  const double l = static_cast<double>(m.n_layer), h = static_cast<double>(m.n_embd), v = static_cast<double>(m.vocab_size);
  // QK^T and PV, forward and backward, over the attention's width (Megatron-LM's
  // query_projection_size = kv_channels x heads: n_embd unless the heads are wider): full s x s,
  // or causal (s/2 keys a query); a sliding-window layer its window's keys, or their causal mean
  // (Megatron-Bridge's flop_utils: W - W(W - 1) / 2s).
  auto attention_flops = [&](bool causal) {
    double keys = 0;
    for (int64_t layer = 0; layer < m.n_layer; ++layer) {
      if (!m.has_attention(layer)) continue;  // a hybrid's non-attention blocks
      const bool windowed =
          m.is_windowed_layer(layer) && static_cast<double>(m.sliding_window) < seq;
      if (windowed)
        keys += causal ? m.mean_keys_per_query(layer, static_cast<int64_t>(seq))
                       : static_cast<double>(m.sliding_window);
      else
        keys += causal ? seq / 2 : seq;
    }
    return 12 * keys * static_cast<double>(m.q_dim());
  };
  const double attention = attention_flops(false);
  switch (count) {
    case FlopCount::PaLM: return 6 * params + attention;
    case FlopCount::RecomputeHardware:
      if (recompute == Recompute::Full) return 8 * params + attention * 4 / 3;
      if (recompute == Recompute::Selective) return 6 * params + attention * 4 / 3;
      return 6 * params + attention;
    case FlopCount::NarayananEq3: return 96 * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h));
    case FlopCount::KorthikantiModel: return 72 * l * h * h * (1 + seq / (6 * h) + v / (12 * h * l));
    case FlopCount::KorthikantiHardware:
      if (recompute == Recompute::Selective) return 72 * l * h * h * (1 + seq / (3 * h) + v / (12 * h * l));
      if (recompute == Recompute::Full) return 96 * l * h * h * (1 + seq / (6 * h)) + 6 * v * h;
      return 72 * l * h * h * (1 + seq / (6 * h) + v / (12 * h * l));
    case FlopCount::NonEmbeddingFull:
    case FlopCount::NonEmbeddingCausal: {
      if (m.is_hybrid() && count == FlopCount::NonEmbeddingCausal)
        return megatron_hybrid_flops_per_token(m, seq);
      ModelConfig no_blocks = m;
      no_blocks.n_layer = 0;
      no_blocks.hybrid_pattern.clear();
      no_blocks.mamba_heads = 0;
      const double blocks = static_cast<double>(m.parameter_count() - no_blocks.parameter_count()) - inactive;
      return 6 * (blocks + v * h) +
             (count == FlopCount::NonEmbeddingFull ? attention : attention_flops(true));
    }
  }
  return 0;
}

}  // namespace loom::plan
