// Reading published runs: every field checked for its type (a wrong one names the run and the
// field), what the source leaves out filled by a rule that is recorded, and a run that cannot
// be predicted refused with its reason. The checking itself is in published_check.cpp.
#include "loom/plan/published_runs.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/plan/host_issue.hpp"
#include "loom/plan/published_fields.hpp"
#include "loom/plan/published_models.hpp"

namespace loom::plan {

const char* figure_name(Figure figure) {
  switch (figure) {
    case Figure::Mfu: return "MFU";
    case Figure::Hfu: return "HFU";
    case Figure::TflopsPerGpu: return "TFLOP/s per GPU";
    case Figure::TokensPerSecond: return "tokens/s per GPU";
    case Figure::StepTime: return "step time s";
    case Figure::MemoryPerGpu: return "memory GiB per GPU";
    case Figure::ModelStates: return "model states GB";
    case Figure::Fits: return "fits (1) / OOM (0)";
    case Figure::LayerForwardMs: return "layer forward ms";
    case Figure::LayerBackwardMs: return "layer backward ms";
    case Figure::LargestModel: return "largest model B";
    case Figure::StatesPerGpu: return "model states GiB per GPU";
    case Figure::ActivationsPerGpu: return "activations GiB per GPU";
    case Figure::AggregatePflops: return "PFLOP/s, all GPUs";
    case Figure::LayerFwdBwdMs: return "layer fwd + bwd ms";
  }
  return "unknown";
}

FigureClass figure_class(Figure figure) {
  switch (figure) {
    case Figure::MemoryPerGpu:
    case Figure::ModelStates:
    case Figure::LargestModel:
    case Figure::StatesPerGpu:
    case Figure::ActivationsPerGpu: return FigureClass::Memory;
    case Figure::Fits: return FigureClass::Verdict;
    default: return FigureClass::Rate;
  }
}

namespace {

using namespace published_detail;

// The measured figures, in the order the summary picks its headline from.
void read_measured(const RunFields& f, PublishedRun& run) {
  f.require_object("measured");
  f.require_object("measured.other");
  const SourceConventions& c = run.conventions;
  auto add = [&](Figure figure, std::optional<double> value, std::string convention) {
    if (!value) return;
    // A measurement is a positive finite number (a verdict is 0 or 1).
    if (!std::isfinite(*value) || *value < 0 || (*value == 0 && figure != Figure::Fits))
      throw_error("published run '", run.id, "': a measured ", figure_name(figure), " of ", *value,
                  " is not a positive number");
    run.measured.push_back({figure, *value, std::move(convention)});
  };
  // A utilisation above 1 is a percentage (MosaicML's tables print 42.57 for 0.4257).
  auto fraction = [&](const char* path) -> std::optional<double> {
    std::optional<double> v = f.number(path);
    if (v && *v > 1.0 && *v <= 100.0) {
      run.assumptions.push_back(std::string(path) + " " + std::to_string(*v).substr(0, 6) + " > 1: read as a percentage");
      *v /= 100.0;
    }
    return v;
  };
  add(Figure::Mfu, fraction("measured.mfu"), flop_count_name(c.mfu));
  add(Figure::Hfu, fraction("measured.hfu"), flop_count_name(c.hfu));
  add(Figure::TflopsPerGpu, f.number("measured.tflops_per_gpu"), flop_count_name(c.tflops));
  add(Figure::TokensPerSecond, f.number("measured.tokens_per_s_per_gpu"), "");
  add(Figure::StepTime, f.number("measured.step_time_s"), "");
  add(Figure::LayerForwardMs, f.number("measured.other.layer_forward_ms"), "");
  add(Figure::LayerBackwardMs, f.number("measured.other.layer_backward_ms"), "");
  // Where a record gives only the sum of a layer's passes, or only the cluster's PFLOP/s, those;
  // beside the per-pass times or the per-GPU TFLOP/s they say nothing more.
  if (!f.number("measured.other.layer_forward_ms") || !f.number("measured.other.layer_backward_ms"))
    add(Figure::LayerFwdBwdMs, f.number("measured.other.layer_fwd_bwd_ms"), "");
  if (!f.number("measured.tflops_per_gpu"))
    add(Figure::AggregatePflops, f.number("measured.other.aggregate_pflops"),
        flop_count_name(c.tflops));
  // A memory breakdown (Korthikanti et al.'s Fig. 1 bars): model states and activations apart,
  // in measured.other.unit (GiB unless it says GB).
  {
    const std::string unit = lowercase(f.text("measured.other.unit"));
    if (!unit.empty() && unit != "gib" && unit != "gb")
      throw_error("published run '", run.id, "': measured.other.unit = '",
                  f.text("measured.other.unit"), "'; expected GiB or GB");
    const double to_gib = unit == "gb" ? 1e9 / (1024.0 * 1024.0 * 1024.0) : 1.0;
    auto in_gib = [&](const char* path) -> std::optional<double> {
      std::optional<double> v = f.number(path);
      if (v) *v *= to_gib;
      return v;
    };
    add(Figure::StatesPerGpu, in_gib("measured.other.params_grads_optimizer_gib"),
        "parameters, gradients and optimizer, GiB");
    add(Figure::ActivationsPerGpu, in_gib("measured.other.activations_gib"),
        "activations by formula, GiB");
  }
  if (run.kind == "analytic_memory_reference")
    add(Figure::ModelStates, f.number("measured.memory_per_gpu_gb"), "(2 + 2 + 12) Psi sharded by ZeRO stage, GB");
  else
    add(Figure::MemoryPerGpu, f.number("measured.memory_per_gpu_gb"),
        c.memory == MemoryCount::Reserved ? "peak reserved by the caching allocator, GiB"
                                          : "model states + activations by formula, GiB");
  if (const std::optional<bool> oom = f.flag("measured.oom")) add(Figure::Fits, *oom ? 0.0 : 1.0, "the run's OOM verdict");
  // The largest model that fits, in billions ("max_measured_model_B_baseline": the ZeRO paper's
  // Table 2), at the ZeRO stage its key names: baseline 0, zero1 / os 1, zero2 / os_g 2, zero3 /
  // os_g_p 3; a key naming none, the layout's stage.
  if (const json* o = f.find("measured.other"); o != nullptr && o->is_object()) {
    static const std::regex largest(R"(^max[a-z_]*model[a-z_]*_b(_.*)?$)");
    for (auto it = o->begin(); it != o->end(); ++it) {
      const std::string key = lowercase(it.key());
      std::smatch match;
      if (!std::regex_match(key, match, largest)) continue;
      if (!it->is_number())
        throw_error("published run '", run.id, "': measured.other.", it.key(), " is not a number");
      const std::string suffix = match[1].matched ? match[1].str() : "";
      int stage = -1;
      if (suffix == "_baseline")
        stage = 0;
      else if (suffix == "_zero1" || suffix == "_os" || suffix == "_pos")
        stage = 1;
      else if (suffix == "_zero2" || suffix == "_os_g" || suffix == "_pos_g")
        stage = 2;
      else if (suffix == "_zero3" || suffix == "_os_g_p" || suffix == "_pos_g_p")
        stage = 3;
      else if (!suffix.empty())
        throw Refusal{"measured.other." + it.key() + ": no ZeRO stage read from '" + suffix + "'"};
      const size_t before = run.measured.size();
      add(Figure::LargestModel, it->get<double>(),
          "largest GPT that fits" +
              (stage >= 0 ? ", ZeRO stage " + std::to_string(stage) : std::string()));
      if (run.measured.size() > before) run.measured.back().zero_stage = stage;
    }
  }
  if (run.measured.empty()) {
    std::string other;
    if (const json* o = f.find("measured.other"); o != nullptr)
      for (auto it = o->begin(); it != o->end(); ++it) other += (other.empty() ? "" : ", ") + it.key();
    throw Refusal{"measures nothing the planner predicts" + (other.empty() ? std::string() : " (measured.other: " + other + ")")};
  }
}

// "32 per DP group; 16M tokens per batch", "2048", "4M tokens": a count per dp group times
// dp, else tokens over the sequence length.
int64_t parse_global_batch_text(const std::string& text, int64_t dp, int64_t seq, std::vector<std::string>& assumptions) {
  std::smatch m;
  if (text.size() > 200)
    throw Refusal{"global_batch is a text of " + std::to_string(text.size()) + " characters"};
  std::string lower = lowercase(text);
  // Thousands separators ("1,280 sequences").
  static const std::regex separator(R"(([0-9]),([0-9]{3})(?![0-9]))");
  for (std::string joined; (joined = std::regex_replace(lower, separator, "$1$2")) != lower;)
    lower = joined;
  if (std::regex_search(lower, m, std::regex(R"(([0-9]+)\s*(sequences\s*)?per\s*(dp|data[- ]parallel))"))) {
    const int64_t per = std::stoll(m[1].str());
    assumptions.push_back("global_batch '" + text + "': " + std::to_string(per) + " x dp " + std::to_string(dp) + " = " +
                          std::to_string(per * dp) + " sequences");
    return per * dp;
  }
  if (std::regex_search(lower, m, std::regex(R"(([0-9]+(\.[0-9]+)?)\s*([km])\s*tokens)"))) {
    const double scale = m[3].str() == "m" ? 1 << 20 : 1 << 10;
    const double tokens = std::stod(m[1].str()) * scale;
    const auto sequences = static_cast<int64_t>(std::llround(tokens / static_cast<double>(seq)));
    assumptions.push_back("global_batch '" + text + "': " + m[1].str() + m[3].str() + " tokens (binary prefix) / seq " +
                          std::to_string(seq) + " = " + std::to_string(sequences) + " sequences");
    return sequences;
  }
  if (std::regex_match(lower, m, std::regex(R"(\s*([0-9]+)\s*(sequences|samples)?\s*)")))
    return std::stoll(m[1].str());
  throw Refusal{"global_batch '" + text + "' gives neither 'N per DP group' nor 'N M tokens' nor a number"};
}

Recompute recompute_of(const std::string& printed, bool* stated) {
  const std::string r = lowercase(printed);
  *stated = true;
  if (r.rfind("full", 0) == 0) return Recompute::Full;
  if (r.find("selective") != std::string::npos) return Recompute::Selective;
  if (r.rfind("none", 0) == 0 || r.rfind("disabled", 0) == 0 || r == "no" || r == "false" || r == "off" ||
      r.rfind("no ", 0) == 0)
    return Recompute::None;
  // A bare yes (MosaicML's "Activation Checkpointing: True") is the whole block.
  if (r == "true" || r == "yes" || r == "on" || r.find("checkpointing") != std::string::npos ||
      r.find("recomput") != std::string::npos)
    return Recompute::Full;
  *stated = false;
  return Recompute::None;
}

void fill_run(const json& entry, PublishedRun& run) {
  const RunFields f(entry, run.id);
  run.kind = f.text("kind");
  run.source = f.text("source");
  run.conventions = conventions_of_source(run.source);
  run.source_label = run.conventions.label;
  run.uncertain = f.flag("uncertain").value_or(false);
  f.require_object("model");
  f.require_object("hardware");
  run.params = f.number("model.params_b").value_or(0) * 1e9;
  read_measured(f, run);
  read_layout(f, run);

  if (run.kind == "analytic_memory_reference") {
    if (run.params <= 0) throw Refusal{"model.params_b is needed for a model-state reference"};
    return;
  }
  // The largest model that fits is searched (published_check.cpp), at the leanest activations
  // where the record does not say: sequences of the model's context (GPT-2's 1024), micro-batch
  // 1, full recomputation.
  if (std::all_of(run.measured.begin(), run.measured.end(),
                  [](const Measured& m) { return m.figure == Figure::LargestModel; })) {
    run.seq_len = f.integer("model.seq_len").value_or(0);
    if (run.seq_len <= 0) {
      run.seq_len = 1024;
      run.assumptions.push_back("seq_len not stated: 1024 (GPT-2's context)");
    }
    run.layout.micro_batch = std::max<int64_t>(1, f.integer("micro_batch").value_or(1));
    bool stated = false;
    run.layout.recompute = recompute_of(f.text("recompute"), &stated);
    if (!stated) {
      run.layout.recompute = Recompute::Full;
      run.assumptions.push_back(
          "recompute not stated: full (a largest model is found at the leanest activations)");
    }
    run.gradient_bytes = f.text("precision").find("fp32 grad") != std::string::npos ? 4 : 2;
    read_hardware(f, run);
    return;
  }
  run.model = model_of(f, run);
  if (run.model.mtp_layers > 0) {
    // A model's multi-token-prediction depths train where its stack's recipe has them
    // (SourceConventions::trains_mtp): Megatron-Core's mtp_num_layers, DeepSeek's own; the
    // Hugging Face-based stacks train next-token prediction alone.
    const std::string depths =
        std::to_string(run.model.mtp_layers) + " MTP depth" + (run.model.mtp_layers > 1 ? "s" : "");
    if (run.conventions.trains_mtp) {
      run.assumptions.push_back(depths +
                                " on the last pipeline stage with the loss (as the model "
                                "trains; Megatron-Core's mtp_num_layers)");
    } else {
      run.assumptions.push_back("no multi-token prediction: " + run.conventions.label +
                                " trains next-token prediction only (the model's " + depths +
                                (run.model.mtp_layers > 1 ? " are" : " is") + " not run)");
      run.model.mtp_layers = 0;
    }
  }
  run.seq_len = run.model.max_seq_len;
  if (run.seq_len % run.layout.cp != 0)
    throw Refusal{"cp = " + std::to_string(run.layout.cp) + " does not divide seq_len " +
                  std::to_string(run.seq_len)};
  if (run.layout.cp > 1 && run.conventions.cp_allgather_repeated_kv) {
    run.layout.cp_comm = CpComm::AllGather;
    run.assumptions.push_back(
        "cp exchange not stated: all-gather (torchtitan's context_parallel_rotate_method default "
        "at 9dec370), of k|v repeated to the query heads (repeat_kv before SDPA)");
  }
  if (run.layout.ep > 1 && !run.model.is_moe()) {
    run.assumptions.push_back("ep " + std::to_string(run.layout.ep) +
                              " on a dense model: no experts to place, ep = 1");
    run.layout.ep = 1;
  } else if (run.model.is_moe() && run.model.n_experts % run.layout.ep != 0) {
    throw Refusal{"ep = " + std::to_string(run.layout.ep) + " does not divide the " +
                  std::to_string(run.model.n_experts) + " experts"};
  } else if (run.model.is_moe() && (run.layout.dp * run.layout.cp) % run.layout.ep != 0) {
    // Megatron-Core's MoE parallel folding (Liu et al. 2025, arXiv 2504.14960): the experts'
    // own mesh refolds the attention's tp x cp x dp ranks, so with an expert tp of 1 ep may span
    // tp as well as dp (Qwen3 235B-A22B: tp 2, dp 16, ep 32). A GPU then holds E / ep whole
    // experts and runs its tp share of the tokens through them: the parameters, FLOPs and
    // all-to-all bytes of ep / tp expert-parallel ranks with each expert split over tp, which
    // is what is modelled.
    const int64_t tp = run.layout.tp, ep = run.layout.ep, replicas = run.layout.dp * run.layout.cp;
    if (tp > 1 && ep % tp == 0 && replicas % (ep / tp) == 0) {
      run.assumptions.push_back(
          "ep " + std::to_string(ep) +
          " spans tp x dp (MoE parallel folding, expert tp 1): modelled as ep " +
          std::to_string(ep / tp) + " with each expert split over tp " + std::to_string(tp) +
          (ep > tp ? " (the same experts, FLOPs and all-to-all bytes per GPU)"
                   : " (the same experts and FLOPs per GPU; the dispatch within the tp group is "
                     "charged as tp's collectives)"));
      run.layout.ep = ep / tp;
    } else {
      throw Refusal{
          "ep = " + std::to_string(ep) + " with tp = " + std::to_string(tp) +
          " and dp x cp = " + std::to_string(replicas) +
          ": an expert-parallel group lies within the data-parallel ranks (ep divides dp x cp) or, "
          "with MoE "
          "parallel folding, spans whole tp groups (tp divides ep, and ep / tp divides dp x cp)"};
    }
  }
  read_hardware(f, run);
  const GpuSpec preset_gpu = gpu_preset(preset_of_gpu(f.text("hardware.gpu")));
  const std::optional<double> stated_peak = f.number("hardware.peak_dense_tflops_assumed");

  bool recompute_stated = false;
  const json* recompute_node = f.find("recompute");
  // recompute: a text, or true / false / 1 / 0 (checkpointing on or off).
  const bool on_off =
      recompute_node != nullptr &&
      (recompute_node->is_boolean() ||
       (recompute_node->is_number() && (*recompute_node == 0 || *recompute_node == 1)));
  const std::string recompute_said =
      on_off ? (*recompute_node == true || *recompute_node == 1 ? "full" : "none")
             : f.text("recompute");
  run.layout.recompute = recompute_of(recompute_said, &recompute_stated);
  // loom's copy may add what the run's launcher config states (recompute_config, with a
  // recompute_config_note naming the file and line; published/README.md).
  if (!recompute_stated && !f.text("recompute_config").empty()) {
    run.layout.recompute = recompute_of(f.text("recompute_config"), &recompute_stated);
    if (!recompute_stated)
      throw_error("published run '", run.id, "': recompute_config = '", f.text("recompute_config"),
                  "'; expected none, selective or full");
    run.assumptions.push_back("recompute " + f.text("recompute_config") +
                              " from the launcher config (recompute_config_note)");
  }
  // LoRA fine-tuning (NeMo's, Megatron-Bridge's and Automodel's "LoRA" tables; "PEFT"): the base
  // weights frozen (TrainingJob::frozen_base). Supervised fine-tuning of every weight ("SFT") on
  // packed sequences is pre-training's work. The record's own fields decide before its source,
  // whose text may name both (NeMo 24.07's table "with SFT ..., and LoRA").
  const std::string own = lowercase(run.id + " " + run.kind + " " + f.text("model.name") + " " +
                                    f.text("model.notes") + " " + f.text("notes") + " " +
                                    f.text("measured.notes") + " " + f.text("parallelism.notes"));
  const std::string source = lowercase(run.source);
  // As words: "_" and "-" separate them (ids write "mbridge2606_LoRA_..."), letters and digits do
  // not; MLA's "q_lora_rank" / "kv_lora_rank" (DeepSeek-V3's, Kimi K2's) are not LoRA.
  static const std::regex lora_word(R"((^|[^a-z0-9])(lora|peft)(?![a-z0-9])(?![\s_]rank))");
  static const std::regex sft_word(
      R"((^|[^a-z0-9])sft(?![a-z0-9])|supervised fine-tuning|full fine-tuning)");
  const auto says_lora = [&](const std::string& text) {
    return std::regex_search(text, lora_word);
  };
  const auto says_sft = [&](const std::string& text) { return std::regex_search(text, sft_word); };
  if (says_lora(own) || (!says_sft(own) && says_lora(source) && !says_sft(source))) {
    run.frozen_base = true;
    run.assumptions.push_back(
        "LoRA fine-tuning: the base weights frozen (input gradients only, no gradient reduction, "
        "optimizer or gradient buffers for them; the adapters not counted)");
  }
  // Automodel's one-GPU recipes (the 8B and 7B LoRA ones) leave checkpointing off, its
  // FSDP2Manager's default; every recipe on more GPUs sets it but gpt-oss 120B's, which the rule
  // takes as full too (its record does not say; at none the planner does not fit it).
  if (!recompute_stated && run.conventions.unstated_recompute_full && run.layout.gpus() > 1) {
    run.layout.recompute = Recompute::Full;
    recompute_stated = true;
    run.assumptions.push_back(
        "recompute not stated: full (the source's benchmark recipes checkpoint every block)");
  }
  run.unstated.recompute = !recompute_stated;
  // torchtitan's "selective activation checkpointing" is its per-op policy (its configs'
  // selective_ac_option = "op"); "selective layer" is its other option, every n-th block fully
  // checkpointed (selective_ac_option = n, "2" by default: config_manager.py at 04133643, "2 =
  // checkpoint every other layer"): full recomputation on 1 / n of the layers.
  const std::string recompute_text =
      lowercase(recompute_said + " " + f.text("recompute_config"));
  if (run.conventions.per_op_selective && run.layout.recompute == Recompute::Selective &&
      recompute_text.find("layer") != std::string::npos) {
    std::smatch every;
    const int64_t n = std::regex_search(recompute_text, every, std::regex(R"(every\s+([0-9]{1,4})(?![0-9]))"))
                          ? std::max<int64_t>(1, std::stoll(every[1].str()))
                          : 2;
    run.layout.recompute = Recompute::Full;
    run.full_recompute_share = 1.0 / static_cast<double>(n);
    run.assumptions.push_back(
        "selective layer = 1 in " + std::to_string(n) +
        " layers fully checkpointed, the rest not (torchtitan's selective_ac_option, default 2)");
  }
  if (run.conventions.per_op_selective && run.layout.recompute == Recompute::Selective &&
      recompute_text.find("layer") == std::string::npos && run.model.arch == Architecture::Llama &&
      run.model.moe_layer_count() == 0) {
    run.selective = SelectivePolicy::TorchtitanOps;
    // torch.compile where the record names it; torchtitan's train_configs leave it off
    // (compile = false at 9dec370), and eager SAC keeps every output the policy saves.
    const std::string record_text =
        lowercase(f.text("id") + " " + f.text("notes") + " " + f.text("parallelism.notes") + " " +
                  f.text("measured.notes") + " " + f.text("precision"));
    run.op_sac_eager = record_text.find("compile") == std::string::npos;
    run.assumptions.push_back(
        run.op_sac_eager
            ? "selective = torchtitan's per-op policy (selective_ac_option 'op', "
              "parallelize_llama.py "
              "at 9dec370), eager (no torch.compile named): wq, wv, w1, w2 and SDPA outputs kept; "
              "wk, wo, w3, norms, RoPE, SwiGLU recomputed"
            : "selective = torchtitan's per-op policy (selective_ac_option 'op', "
              "parallelize_llama.py "
              "at 9dec370) under torch.compile: wq, wv, w1 and SDPA outputs kept (w2's, which "
              "backward never reads, dropped by the partitioner); wk, wo, w3, norms, RoPE, SwiGLU "
              "recomputed");
  }
  apply_moe_host_issue(
      run, lowercase(f.text("id") + " " + f.text("notes") + " " + f.text("model.name")));
  const std::string precision = lowercase(f.text("precision"));
  // "FP8", "amp_fp8", "FP8-CS", "Float8 (torchao)", "E4M3": Linear layers in 8-bit floats.
  // "NVFP4", "MXFP4", "FP4", "E2M1": the linear layers' GEMMs in 4-bit floats, everything the
  // FP8 recipe keeps in higher precision kept so (Transformer Engine's NVFP4 recipe).
  run.fp4 = !contains_any(precision, {"fp4", "float4", "e2m1"}).empty();
  if (run.fp4 && run.cluster.gpu.fp4_tflops <= 0)
    throw Refusal{"precision '" + f.text("precision") + "' on " + run.cluster.gpu.name +
                  ", which has no FP4 tensor cores (Blackwell and later have)"};
  // "MXFP8", "FP8_MX", "FP8-MX", "FP8_MX_32x32": FP8 with a scale per 32 elements (Blackwell).
  run.mx =
      !run.fp4 && !contains_any(precision, {"mxfp8", "fp8_mx", "fp8-mx", "fp8 mx", "mx8"}).empty();
  if (run.mx && run.cluster.gpu.fp4_tflops <= 0)
    throw Refusal{"precision '" + f.text("precision") + "' on " + run.cluster.gpu.name +
                  ", which has no block-scaled (MX) tensor cores (Blackwell and later have)"};
  run.fp8 = run.fp4 || run.mx || !contains_any(precision, {"fp8", "float8", "e4m3"}).empty();
  if (run.fp8 && run.cluster.gpu.fp8_tflops <= 0)
    throw Refusal{"precision '" + f.text("precision") + "' on " + run.cluster.gpu.name + ", which has no FP8 tensor cores"};
  // An FP8 run may state the FP8 peak as its "dense peak" (llm-foundry's FP8 table divides by
  // 1979 on an H100): a stated peak nearer the part's FP8 rate than its BF16 rate is the FP8
  // peak, and the BF16 work (attention, the head, norms) keeps the part's BF16 rate.
  // Within 15% of the part's dense FP8 rate only (a sparse figure, twice it, is not read so).
  if (run.fp8 && stated_peak && preset_gpu.fp8_tflops > 0 &&
      std::fabs(std::log(*stated_peak / preset_gpu.fp8_tflops)) < std::log(1.15)) {
    run.stated_fp8_peak = true;
    // A power limit scaled the FP8 rate above; the BF16 one scales alike.
    run.cluster.gpu.bf16_tflops =
        preset_gpu.bf16_tflops * run.cluster.gpu.fp8_tflops / preset_gpu.fp8_tflops;
    run.cluster.gpu.fp8_tflops = *stated_peak;
    char text[200];
    std::snprintf(
        text, sizeof text,
        "the stated peak %.0f TFLOP/s is the part's FP8 rate (BF16 %.0f): BF16 work at %.0f",
        *stated_peak, preset_gpu.bf16_tflops, run.cluster.gpu.bf16_tflops);
    run.assumptions.push_back(text);
  }
  // The optimizer's own precision where the record states it (its launcher config):
  // `optimizer.state_dtype` for Adam's copy and moments, `optimizer.grad_dtype` for the gradient
  // buffer (apex's distributed_fused_adam: dtype and grad_sync_dtype).
  const std::string state_dtype = lowercase(f.text("optimizer.state_dtype"));
  const std::string grad_dtype = lowercase(f.text("optimizer.grad_dtype"));
  for (const std::string* stated : {&state_dtype, &grad_dtype})
    if (!stated->empty() && *stated != "bf16" && *stated != "fp32")
      throw_error("published run '", run.id, "': optimizer dtype '", *stated,
                  "'; expected bf16 or fp32");
  if (state_dtype == "bf16") {
    run.master_bytes = 2;
    run.moment_bytes = 4;
    run.assumptions.push_back("optimizer state in bf16 as stated: copy and moments 6 bytes a parameter");
  } else if (state_dtype.empty() && run.conventions.bf16_parameters_no_master) {
    run.master_bytes = 0;
    run.moment_bytes = run.model.is_moe() ? 4 : 8;
    run.assumptions.push_back(
        run.model.is_moe() ? "bf16 parameters, no fp32 copy, Adam moments in bf16 (the source's "
                             "MoE recipes: torch.optim.Adam on bf16 parameters)"
                           : "bf16 parameters, no fp32 copy, Adam moments in fp32 (the source's "
                             "dense recipes: Transformer Engine's FusedAdam defaults)");
  }
  if (!grad_dtype.empty()) {
    run.gradient_bytes = grad_dtype == "bf16" ? 2 : 4;
    run.assumptions.push_back("gradient buffers in " + grad_dtype + " as stated");
  } else if (precision.find("fp32 grad") != std::string::npos) {
    run.gradient_bytes = 4;
  } else if (run.conventions.megatron) {
    run.gradient_bytes = 4;
    run.assumptions.push_back("fp32 gradient buffers (Megatron-LM's bf16 default)");
  }
  const std::string attention = f.text("attention");
  if (!attention.empty() && attention != "flash" && attention != "materialized")
    throw_error("published run '", run.id, "': attention = '", attention, "'; expected flash or materialized");
  run.attention_kernel_speedup = run.conventions.attention_kernel_speedup;
  const std::string notes =
      lowercase(f.text("measured.notes") + " " + f.text("notes") + " " + f.text("model.notes") +
                " " + f.text("parallelism.notes") + " " + f.text("precision"));
  // Megatron-LM's --tp-comm-overlap named in the record (the Megatron-LM README's benchmark notes
  // list it), or the source's recipes set it.
  run.tp_comm_overlap =
      run.conventions.tp_comm_overlap ||
      !contains_any(notes, {"tp-comm-overlap", "tp comm overlap", "tp_comm_overlap"}).empty();
  read_kernels(f, notes, attention, run);
  // A dispatcher that sends a token once per destination rank (TrainingJob::moe_dispatch_per_rank)
  // where the record names one.
  const std::string dispatcher = contains_any(notes, {"deepep", "hybridep", "hybrid-ep"});
  if (run.model.is_moe() && !dispatcher.empty()) {
    run.moe_dispatch_per_rank = true;
    run.assumptions.push_back("expert dispatch by '" + dispatcher +
                              "': each token sent once to each rank holding its experts");
  }

  // The stated micro-batch, 0 when not stated (a stated 0 reads as not stated).
  const int64_t mbs = f.integer("micro_batch").value_or(0);
  if (f.integer("micro_batch") && mbs == 0) run.assumptions.push_back("micro_batch 0: read as not stated");
  run.layout.micro_batch = mbs > 0 ? mbs : 1;
  run.unstated.micro_batch = mbs == 0;
  const json* gb = f.find("global_batch");
  if (gb != nullptr && gb->is_string() && says_not_stated(gb->get<std::string>())) gb = nullptr;
  if (gb != nullptr) {
    if (gb->is_number_integer() && gb->get<int64_t>() > 0 && gb->get<int64_t>() <= int64_t{10'000'000'000})
      run.global_batch = gb->get<int64_t>();
    else if (gb->is_string())
      run.global_batch = parse_global_batch_text(gb->get<std::string>(), run.layout.dp, run.seq_len, run.assumptions);
    else
      throw_error("published run '", run.id, "': global_batch = ", gb->dump(),
                  " is not a positive integer (at most 10^10) or a text");
  } else if (run.global_batch == 0) {
    // 4M tokens (2^22): the batch of LLaMA 1 and 2 at every size, near GPT-3's 3.2M.
    run.global_batch = std::max<int64_t>(1, (int64_t{1} << 22) / run.seq_len);
    run.assumptions.push_back("global_batch not stated: 4M tokens = " + std::to_string(run.global_batch) + " sequences");
  }
  if (run.global_batch <= 0) throw Refusal{"global_batch comes to no sequences"};
  // A pipeline fed fewer micro-batches than it has stages idles most ranks most of the time; no
  // published benchmark runs one. Where the stated micro-batch leaves fewer than pp per step,
  // it is the data-parallel rank's local batch, which the stack splits into micro-batches
  // (torchtitan's "local batch size": its pipeline schedules take as many micro-batches as
  // stages by default); the planner picks the split, the fastest that fits.
  const PlanLayout& l = run.layout;
  if (mbs > 0 && l.pp > 1 && run.global_batch / std::max<int64_t>(1, l.dp * mbs) < l.pp) {
    const std::string read = "micro_batch " + std::to_string(mbs) + " leaves " +
                             std::to_string(run.global_batch / std::max<int64_t>(1, l.dp * mbs)) + " micro-batches for " +
                             std::to_string(l.pp) + " pipeline stages: read as the local batch";
    if (run.conventions.torchtitan_pipeline && mbs % l.pp == 0) {
      run.layout.micro_batch = mbs / l.pp;
      run.assumptions.push_back(read + ", split into pp = " + std::to_string(l.pp) +
                                " micro-batches of " + std::to_string(run.layout.micro_batch) +
                                " (torchtitan's pipeline_parallel_microbatches default)");
    } else {
      run.unstated.micro_batch = true;
      run.assumptions.push_back(read + ", split by the planner");
    }
  }
  // No micro-batch stated under torchtitan's pipeline: its schedules split each data-parallel
  // rank's local batch into pp micro-batches (pipeline_parallel_microbatches' default).
  if (mbs == 0 && l.pp > 1 && run.conventions.torchtitan_pipeline) {
    const int64_t local = run.global_batch / std::max<int64_t>(1, l.dp);
    if (local >= l.pp && local % l.pp == 0) {
      run.layout.micro_batch = local / l.pp;
      run.unstated.micro_batch = false;
      run.assumptions.push_back("micro_batch not stated: the local batch of " +
                                std::to_string(local) + " split into pp = " + std::to_string(l.pp) +
                                " micro-batches of " + std::to_string(run.layout.micro_batch) +
                                " (torchtitan's pipeline_parallel_microbatches default)");
    }
  }
  if (run.conventions.torchtitan_pipeline && run.unstated.interleaved) {
    run.layout.vp = 2;
    run.unstated.vp = run.unstated.interleaved = false;
    run.assumptions.push_back("interleaved: 2 stages per rank (torchtitan's default without split points)");
  }
}

PublishedRun parse_run(const json& entry, size_t index) {
  PublishedRun run;
  run.id = entry.is_object() && entry.contains("id") && entry["id"].is_string() ? entry["id"].get<std::string>()
                                                                                : "#" + std::to_string(index);
  if (!entry.is_object()) {
    run.refused = "published runs: entry " + std::to_string(index) + " is not an object";
    run.malformed = true;
    return run;
  }
  try {
    fill_run(entry, run);
  } catch (const Refusal& r) {
    run.refused = r.why;
  } catch (const Error& e) {
    run.refused = e.what();
    run.malformed = true;
  }
  return run;
}

}  // namespace

std::vector<PublishedRun> parse_published_runs(const std::string& text, const std::string& name) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw_error("published runs: '", name, "' is not valid JSON: ", e.what());
  }
  if (!doc.is_array()) throw_error("published runs: '", name, "' must hold a JSON array of runs");
  std::vector<PublishedRun> runs;
  for (size_t i = 0; i < doc.size(); ++i) runs.push_back(parse_run(doc[i], i));
  return runs;
}

std::vector<PublishedRun> read_published_runs(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error("published runs: cannot open '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_published_runs(text.str(), path);
}

}  // namespace loom::plan
