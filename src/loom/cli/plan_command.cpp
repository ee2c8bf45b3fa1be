// `loom plan`: the layout of a training job before any GPU hour is spent. With --layout it
// evaluates that layout; without it searches all layouts in the playbook's three steps.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "loom/cli/commands.hpp"
#include "loom/cli/plan_file.hpp"
#include "loom/core/error.hpp"
#include "loom/obs/svg_support.hpp"
#include "loom/plan/cluster_model.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/machine_profile.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/plan_charts.hpp"
#include "loom/plan/published_models.hpp"
#include "loom/plan/published_runs.hpp"
#include "loom/plan/search.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/train_config.hpp"

namespace loom::cli {

namespace {

// A TOML file with a [model] table, an engine preset, or a published model by name ("Qwen3
// 30B-A3B", "gpt-oss 120B", "Llama 4 Maverick": the planner's table of published
// architectures, its approximations said on stderr).
ModelConfig plan_model(const std::string& name_or_path) {
  if (std::filesystem::is_regular_file(name_or_path)) {
    ConfigReader reader = ConfigReader::from_file(name_or_path);
    return parse_model_config(reader);
  }
  const std::vector<std::string> presets = model_preset_names();
  if (std::find(presets.begin(), presets.end(), name_or_path) != presets.end())
    return model_preset(name_or_path);
  if (const std::optional<plan::PublishedModel> published =
          plan::find_published_model(name_or_path)) {
    if (!published->not_representable.empty())
      throw_error("--model '", name_or_path, "' reads as ", published->name, ": ",
                  published->not_representable);
    if (!published->approximation.empty())
      std::fprintf(stderr, "model %s (%s): %s\n", published->name.c_str(),
                   published->source.c_str(), published->approximation.c_str());
    if (published->config.mtp_layers > 0 && !published->config.is_hybrid())
      std::fprintf(stderr,
                   "model %s: trains %lld multi-token-prediction depth%s on the last pipeline "
                   "stage, as Megatron-Core runs it%s\n",
                   published->name.c_str(), static_cast<long long>(published->config.mtp_layers),
                   published->config.mtp_layers > 1 ? "s" : "",
                   published->name.rfind("DeepSeek-V3", 0) == 0
                       ? " (the preset deepseek-v3-gqa plans the model without)"
                       : "");
    return published->config;
  }
  return model_preset(name_or_path);  // its error lists the presets
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;


nlohmann::json memory_json(const plan::MemoryBreakdown& mem) {
  return {{"parameters", mem.parameters}, {"gradients", mem.gradients}, {"optimizer_state", mem.optimizer_state},
          {"activations", mem.activations}, {"comm_buffers", mem.comm_buffers}, {"workspace", mem.workspace},
          {"total", mem.total()}};
}

nlohmann::json time_json(const plan::StepTime& t) {
  return {{"step_s", t.total_s},
          {"compute_s", t.compute_s},
          {"exposed_comm_s", t.exposed_comm_s},
          {"bubble_s", t.bubble_s},
          {"optimizer_s", t.optimizer_s},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"micro_batches", t.micro_batches},
          {"offload_s", t.offload_s},
          // Each dimension's communication before overlap (what exposed_comm_s leaves visible).
          {"comm_s",
           {{"tp", t.tp_comm_s},
            {"dp", t.dp_comm_s},
            {"cp", t.cp_comm_s},
            {"pp", t.pp_comm_s},
            {"ep", t.ep_comm_s}}}};
}

plan::TrainingJob job_of(const PlanArgs& args) {
  plan::TrainingJob job;
  job.seq_len = args.seq_len;
  job.global_batch = args.global_batch;
  job.memory.flash_attention = args.attention == "flash";
  job.memory.seq_len = args.seq_len;
  job.moe_imbalance = args.moe_imbalance;
  job.memory.activation_bytes = args.precision == "f32" ? 4 : 2;
  job.memory.state = args.precision == "f32" ? plan::kF32Adam : plan::kMixedPrecisionAdam;
  // LoRA: the base keeps its weights only (TrainingJob::frozen_base).
  job.frozen_base = args.finetune == "lora";
  if (job.frozen_base) job.memory.state = plan::frozen_base_state(job.memory.state);
  job.memory.offloaded_layers = args.offload_layers;
  // A GPU preset's plan is of a tuned run: uneven pipeline stages balanced against the head and
  // MTP depths, as Megatron-Core's layouts set them (GpuJob::balanced_stages).
  job.memory.balanced_stages = true;
  // fp8: Transformer Engine's recipe, Linear GEMMs in FP8 and their saved inputs in 1 byte;
  // the rest in bf16 with fp32 master weights.
  // mxfp8: the same at the block-scaled kernels' rate (TrainingJob::mx_gemms).
  // nvfp4: the same, with the Linear GEMMs in 4 bits (TrainingJob::fp4_gemms).
  if (args.precision == "fp8" || args.precision == "mxfp8" || args.precision == "nvfp4") {
    const plan::GpuSpec gpu = plan_cluster(args, args.gpus_per_node).gpu;
    if (gpu.fp8_tflops <= 0)
      throw_error("plan: --precision ", args.precision, " on ", gpu.name, ", which has no FP8 tensor cores; use bf16");
    if (args.precision == "nvfp4" && gpu.fp4_tflops <= 0)
      throw_error("plan: --precision nvfp4 on ", gpu.name,
                  ", which has no FP4 tensor cores (B200, B300, GB200 and GB300 have); use fp8 or bf16");
    if (args.precision == "mxfp8" && gpu.fp4_tflops <= 0)
      throw_error("plan: --precision mxfp8 on ", gpu.name,
                  ", which has no block-scaled (MX) tensor cores (B200, B300, GB200 and GB300 "
                  "have); use fp8 or bf16");
    job.fp8_gemms = true;
    job.fp4_gemms = args.precision == "nvfp4";
    job.mx_gemms = args.precision == "mxfp8";
    job.memory.fp8_linear_inputs = true;
  }
  if (!args.gemm_timings.empty()) {
    const std::vector<plan::GemmTiming> timings = plan::read_gemm_timings(args.gemm_timings);
    job.gemm = plan::fit_gemm_efficiency(timings, plan_cluster(args, args.gpus_per_node).gpu.bf16_tflops * 1e12);
    if (!args.json)
      std::printf("GEMM efficiency calibrated from %zu timings in %s: %.1f%% of peak, half_dim %.0f\n", timings.size(),
                  args.gemm_timings.c_str(), 100 * job.gemm->peak_fraction, job.gemm->half_dim);
  }
  return job;
}

// The machine a plan is for: a GPU cluster from the presets and settings, or with --profile
// the machine `loom calibrate` measured, running loom's own engine as the profile measured it:
// the CPU engine in f32, or (a `--device cuda` profile) the CUDA engine in bf16.
struct Machine {
  plan::ClusterSpec cluster;
  plan::TrainingJob job;
  // A CPU profile: memory is the CPU engine's own bytes (predict_engine_memory), not the GPU
  // model's. A CUDA profile keeps the GPU model, with the CUDA engine's state bytes.
  bool cpu_engine = false;
};

Machine machine_of(const PlanArgs& args, int64_t gpus) {
  if ((args.given.count("fp8-recipe") > 0 || args.fp8_recipe != "delayed") &&
      (args.profile.empty() || args.precision != "fp8"))
    throw_error(
        "plan: --fp8-recipe (training.fp8_recipe) is the recipe of loom's own engine, predicted "
        "with --precision fp8 and a CPU --profile (the GPU presets charge Transformer Engine's "
        "FP8 casts whatever the recipe)");
  if (args.profile.empty()) return {plan_cluster(args, gpus), job_of(args)};
  if (!args.gemm_timings.empty()) throw_error("plan: give --profile or --gemm-timings, not both (a profile has its GEMM timings)");
  if (args.attention != "flash")
    throw_error("plan: --profile predicts loom's engine, whose attention is flash-style; drop --attention ", args.attention);
  const ModelConfig model = plan_model(args.model);
  if (model.is_hybrid())
    throw_error("plan: --profile predicts loom's own engine, which does not build ", args.model,
                " (a hybrid Mamba stack); drop --profile to plan it on GPU presets");
  const plan::MachineProfile profile = plan::read_machine_profile(args.profile);
  const bool cuda = profile.device == Device::CUDA;
  const std::string measured = cuda ? "bf16" : "f32";
  // The profile's own precision unless one was asked for (bf16 is the default of the GPU plans).
  const bool asked = args.given.count("precision") > 0 || args.precision != "bf16";
  // FP8 on the CPU engine is its f32 engine plus the emulation's quantisations (engine_fp8.hpp).
  const bool cpu_fp8 = !cuda && args.precision == "fp8";
  if (asked && args.precision != measured && !cpu_fp8)
    throw_error("plan: --profile predicts loom's ", cuda ? "CUDA" : "CPU",
                " engine, which the profile measured in ", measured,
                cuda ? "" : " (and its FP8 emulation: --precision fp8)", "; drop --precision ",
                args.precision);
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  plan::ProfiledMachine m =
      plan::profiled_machine(profile, gpus, plan::memory_bytes_per_rank(profile, gpus, ram));
  if (cpu_fp8) {
    if (!m.job.engine_fp8.rates.measured())
      throw_error("plan: --precision fp8 with --profile ", args.profile,
                  ": the profile has no FP8 quantisation rates (written before `loom calibrate` "
                  "measured them); run loom calibrate again");
    m.job.engine_fp8.recipe = args.fp8_recipe == "current"     ? plan::EngineFp8Recipe::Current
                              : args.fp8_recipe == "blockwise" ? plan::EngineFp8Recipe::Blockwise
                                                               : plan::EngineFp8Recipe::Delayed;
  }
  m.job.seq_len = args.seq_len;
  m.job.global_batch = args.global_batch;
  m.job.moe_imbalance = args.moe_imbalance;
  if (args.finetune != "full")
    throw_error("plan: --profile predicts loom's own engine, which trains every weight; drop --finetune ",
                args.finetune);
  if (args.offload_layers > 0)
    throw_error(
        "plan: --profile predicts loom's own engine, which keeps activations on the device; drop "
        "--offload-layers");
  m.job.memory.seq_len = args.seq_len;
  m.cluster.gpu.name = (cuda ? "profiled " : "ranks of ") + profile.machine;
  return {m.cluster, m.job, !cuda};
}

void print_cluster(const ModelConfig& model, const plan::ClusterSpec& cluster, const plan::StepTime& t, const PlanArgs& args) {
  if (args.train_tokens <= 0) return;
  // A checkpoint holds bf16 weights plus fp32 master and moments: 14 bytes per parameter.
  const double checkpoint_bytes = 14.0 * static_cast<double>(model.parameter_count());
  const plan::ClusterEstimate c = plan::estimate_cluster(cluster, t.total_s, static_cast<double>(args.global_batch * args.seq_len),
                                                         args.train_tokens, checkpoint_bytes);
  std::printf("\ncluster: %lld GPUs in %lld nodes | %.2f MW (%.2f MW IT, PUE %.2f) | %.1f failures/day (job MTBF %.1f h)\n",
              static_cast<long long>(cluster.gpus()), static_cast<long long>(cluster.nodes), c.power_mw, c.it_power_mw,
              cluster.pue, c.failures_per_day, c.mtbf_hours);
  std::printf("checkpoint %.0f GB written in %.0f s, every %.1f min (Daly) | goodput %.1f%% | %.3g tokens in %.1f days, "
              "%.0f MWh, %.3g GPU-hours\n",
              checkpoint_bytes / 1e9, c.checkpoint_write_s, c.checkpoint_interval_s / 60, 100 * c.goodput, args.train_tokens,
              c.wall_time_hours / 24, c.energy_mwh, c.gpu_hours);
  if (c.cost > 0) std::printf("cost at %.2f per GPU-hour: %.4g\n", cluster.price_per_gpu_hour, c.cost);
}

// --svg: the memory of the candidates and the predicted timeline of the first. A timeline too
// large to draw is reported, not an error: the plan itself is still good.
void write_charts(const PlanArgs& args, const std::vector<plan::Candidate>& candidates, double usable_bytes) {
  if (args.svg_dir.empty() || candidates.empty()) return;
  std::filesystem::create_directories(args.svg_dir);
  const std::string memory = args.svg_dir + "/memory.svg", timeline = args.svg_dir + "/timeline.svg";
  write_svg_file(memory, plan::memory_chart_svg(candidates, usable_bytes, "memory per GPU: " + args.model));
  std::string wrote = memory;
  try {
    write_svg_file(timeline, plan::pipeline_timeline_svg(candidates.front(), "predicted step timeline: " + args.model));
    wrote += ", " + timeline;
  } catch (const Error& e) {
    std::fprintf(args.json ? stderr : stdout, "no timeline: %s\n", e.what());
  }
  std::fprintf(args.json ? stderr : stdout, "wrote %s\n", wrote.c_str());
}

std::vector<plan::Candidate> top_candidates(const plan::SearchResult& r, int top) {
  return {r.ranked.begin(), r.ranked.begin() + std::min<std::ptrdiff_t>(top, static_cast<std::ptrdiff_t>(r.ranked.size()))};
}

int run_search(const PlanArgs& args, const ModelConfig& model) {
  if (args.gpus <= 0) throw_error("plan: give --gpus to search (or --layout to evaluate one layout)");
  const Machine machine = machine_of(args, args.gpus);
  const plan::ClusterSpec& cluster = machine.cluster;
  const plan::TrainingJob& job = machine.job;
  const plan::SearchResult r = plan::search_layouts(model, cluster, job);
  if (args.json) {
    nlohmann::json top = nlohmann::json::array();
    for (size_t i = 0; i < r.ranked.size() && i < static_cast<size_t>(args.top); ++i)
      top.push_back({{"layout", r.ranked[i].layout.describe()}, {"memory_bytes", memory_json(r.ranked[i].memory)},
                     {"time", time_json(r.ranked[i].time)}, {"engine_supported", r.ranked[i].engine_note.empty()},
                     {"engine_note", r.ranked[i].engine_note}});
    std::printf("%s\n", nlohmann::json{{"valid", r.valid}, {"fitting", r.fitting}, {"batch_ok", r.batch_ok},
                                       {"gpus_needed", r.gpus_needed}, {"top", top},
                                       {"why", plan::explain_winner(r)}}.dump(2).c_str());
    write_charts(args, top_candidates(r, args.top), r.usable_bytes);
    return r.ranked.empty() ? 1 : 0;
  }
  std::printf("model %s: %.2fB parameters | %lld x %s (%lld per node) | seq %lld, global batch %lld sequences\n",
              args.model.c_str(), static_cast<double>(model.parameter_count()) / 1e9, static_cast<long long>(args.gpus),
              cluster.gpu.name.c_str(), static_cast<long long>(cluster.gpus_per_node), static_cast<long long>(args.seq_len),
              static_cast<long long>(args.global_batch));
  std::printf("\nstep 1, fit the model: %lld valid layouts; %lld fit in %.1f GiB (90%% of HBM); the leanest needs %.1f GiB (%s)\n",
              static_cast<long long>(r.valid), static_cast<long long>(r.fitting), r.usable_bytes / kGiB,
              r.least_memory.memory.total() / kGiB, r.least_memory.layout.describe().c_str());
  if (r.fitting == 0) {
    if (r.gpus_needed > 0)
      throw_error("plan: no layout fits ", args.model, " on ", args.gpus, " x ", cluster.gpu.name, "; the smallest count of ",
                  cluster.gpu.name, " that fits is ", r.gpus_needed, " GPUs (or use GPUs with at least ",
                  static_cast<long long>(r.least_memory.memory.total() / kGiB / plan::kUsableMemoryFraction + 1), " GiB)");
    throw_error("plan: no layout fits ", args.model, " on any count of ", cluster.gpu.name, " up to 4M GPUs");
  }
  std::printf("step 2, reach the batch: %lld of them split %lld sequences into dp x mbs x micro-batches\n",
              static_cast<long long>(r.batch_ok), static_cast<long long>(args.global_batch));
  if (r.ranked.empty()) throw_error("plan: no fitting layout splits the global batch of ", args.global_batch, " sequences");
  std::printf("step 3, maximise throughput: the fastest %d\n\n", args.top);
  std::printf("%-58s %7s %7s %7s %7s | %8s %8s %8s %8s | %10s %6s\n", "layout", "param", "grad", "optim", "activ",
              "step s", "compute", "comm", "bubble", "tokens/s", "MFU");
  for (size_t i = 0; i < r.ranked.size() && i < static_cast<size_t>(args.top); ++i) {
    const plan::Candidate& c = r.ranked[i];
    std::printf("%-58s %7.1f %7.1f %7.1f %7.1f | %8.2f %8.2f %8.2f %8.2f | %10.0f %5.1f%%%s%s\n", c.layout.describe().c_str(),
                c.memory.parameters / kGiB, c.memory.gradients / kGiB, c.memory.optimizer_state / kGiB,
                c.memory.activations / kGiB, c.time.total_s, c.time.compute_s, c.time.exposed_comm_s, c.time.bubble_s,
                c.time.tokens_per_s, 100 * c.time.mfu, c.engine_note.empty() ? "" : "  ", c.engine_note.c_str());
  }
  std::printf("(memory in GiB per GPU; comm = exposed communication; paste a layout into --layout or the [parallel]\n"
              "table's layout key; \"engine: not yet supported\" marks a layout loom's trainer refuses today)\n\n"
              "why: %s\n", plan::explain_winner(r).c_str());
  print_cluster(model, cluster, r.ranked.front().time, args);
  write_charts(args, top_candidates(r, args.top), r.usable_bytes);
  return 0;
}

// Published runs: every figure each run measured against the planner's prediction in the
// source's convention, the rules applied to what the run leaves out, the runs refused and
// why, then the coverage and errors the README quotes. Exit code 1 when a run is malformed
// (a field of the wrong type), so a broken file does not pass unnoticed.
int run_validate(const PlanArgs& args) {
  const std::vector<plan::PublishedRun> runs = plan::read_published_runs(args.validate);
  std::vector<plan::RunCheck> checks;
  for (const plan::PublishedRun& run : runs) checks.push_back(plan::check_published_run(run));
  const plan::ValidationSummary summary = plan::summarize(checks);
  auto stats_json = [](const plan::ErrorStats& e) {
    return nlohmann::json{{"count", e.count}, {"median_abs_error", e.median}, {"p90_abs_error", e.p90}, {"worst_abs_error", e.worst}};
  };
  if (args.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const plan::RunCheck& c : checks) {
      nlohmann::json figures = nlohmann::json::array();
      for (const plan::FigureCheck& f : c.figures)
        figures.push_back({{"figure", plan::figure_name(f.measured.figure)}, {"convention", f.measured.convention},
                           {"published", f.measured.value}, {"predicted", f.predicted}, {"relative_error", f.relative_error}});
      rows.push_back({{"id", c.run->id},
                      {"source", c.run->source_label},
                      {"answered", c.answered},
                      {"refused", c.run->refused},
                      {"malformed", c.run->malformed},
                      {"layout", c.answered ? c.layout.describe() : ""},
                      {"figures", figures},
                      {"assumptions", c.run->assumptions},
                      {"picks", c.picks},
                      {"notes", c.notes},
                      {"fits", c.fits},
                      {"allocated_gib", c.allocated_gib},
                      {"reserved_gib", c.reserved_gib}});
    }
    nlohmann::json sources = nlohmann::json::array();
    for (const plan::SourceCoverage& src : summary.by_source)
      sources.push_back({{"source", src.label}, {"runs", src.runs}, {"answered", src.answered}, {"rates", stats_json(src.rates)}});
    nlohmann::json kinds = nlohmann::json::object();
    for (const auto& [name, stats] : summary.by_figure) kinds[name] = stats_json(stats);
    std::printf("%s\n", nlohmann::json{{"runs", rows}, {"total", summary.runs}, {"answered", summary.answered},
                                       {"malformed", summary.malformed}, {"rates", stats_json(summary.rates)},
                                       {"memory", stats_json(summary.memory)}, {"verdicts", summary.verdicts},
                                       {"verdicts_right", summary.verdicts_right}, {"by_source", sources},
                                       {"by_figure", kinds}}.dump(2).c_str());
    return summary.malformed > 0 ? 1 : 0;
  }
  for (const plan::RunCheck& c : checks) {
    if (!c.answered) {
      std::printf("%s\n  %s: %s\n", c.run->id.c_str(), c.run->malformed ? "MALFORMED" : "refused",
                  c.run->refused.empty() && !c.picks.empty() ? c.picks.front().c_str() : c.run->refused.c_str());
      continue;
    }
    std::printf("%s [%s] %s%s\n", c.run->id.c_str(), c.run->source_label.c_str(),
                c.run->kind == "analytic_memory_reference" ? "-" : c.layout.describe().c_str(), c.fits ? "" : " (does not fit)");
    for (const plan::FigureCheck& f : c.figures) {
      const bool verdict = f.measured.figure == plan::Figure::Fits;
      char error[32];
      if (verdict)
        std::snprintf(error, sizeof error, "%s", f.relative_error == 0 ? "right" : "WRONG");
      else
        std::snprintf(error, sizeof error, "%+6.1f%%", 100 * f.relative_error);
      std::printf("  %-20s %-44s published %10.4g predicted %10.4g  %s\n", plan::figure_name(f.measured.figure),
                  f.measured.convention.c_str(), f.measured.value, f.predicted, error);
    }
    std::string notes;
    for (const std::string& a : c.run->assumptions) notes += (notes.empty() ? "" : "; ") + a;
    for (const std::string& p : c.picks)
      notes += (notes.empty() ? "" : "; ") + p +
               (p.find("none fits") == std::string::npos ? " (fastest that fits)" : "");
    for (const std::string& n : c.notes) notes += (notes.empty() ? "" : "; ") + n;
    if (!notes.empty()) std::printf("  assumed: %s\n", notes.c_str());
  }
  std::printf("\ncoverage: %lld of %lld runs answered, %lld refused with a reason%s\n", static_cast<long long>(summary.answered),
              static_cast<long long>(summary.runs), static_cast<long long>(summary.runs - summary.answered),
              summary.malformed > 0 ? " (some MALFORMED)" : "");
  std::printf("%-32s %5s %9s %8s %8s %8s\n", "source", "runs", "answered", "median", "p90", "worst");
  for (const plan::SourceCoverage& src : summary.by_source) {
    if (src.rates.count > 0)
      std::printf("%-32s %5lld %9lld %7.1f%% %7.1f%% %7.1f%%\n", src.label.c_str(), static_cast<long long>(src.runs),
                  static_cast<long long>(src.answered), 100 * src.rates.median, 100 * src.rates.p90, 100 * src.rates.worst);
    else
      std::printf("%-32s %5lld %9lld %8s %8s %8s\n", src.label.c_str(), static_cast<long long>(src.runs),
                  static_cast<long long>(src.answered), "-", "-", "-");
  }
  std::printf("\n%-32s %5s %8s %8s %8s\n", "measured kind", "count", "median", "p90", "worst");
  for (const auto& [name, e] : summary.by_figure)
    std::printf("%-32s %5lld %7.1f%% %7.1f%% %7.1f%%\n", name.c_str(), static_cast<long long>(e.count), 100 * e.median,
                100 * e.p90, 100 * e.worst);
  std::printf("\nutilisation and throughput (one headline figure per run): %lld figures, median |error| %.1f%%, p90 %.1f%%, "
              "worst %.1f%%\nmemory: %lld figures, median |error| %.1f%%, worst %.1f%%\nOOM/fits verdicts: %lld of %lld right\n",
              static_cast<long long>(summary.rates.count), 100 * summary.rates.median, 100 * summary.rates.p90,
              100 * summary.rates.worst, static_cast<long long>(summary.memory.count), 100 * summary.memory.median,
              100 * summary.memory.worst, static_cast<long long>(summary.verdicts_right),
              static_cast<long long>(summary.verdicts));
  return summary.malformed > 0 ? 1 : 0;
}

}  // namespace

int run_plan(const PlanArgs& command_line) {
  PlanArgs args = command_line;
  apply_plan_file(args);
  if (!args.validate.empty()) {
    // Each run's model, cluster, layout and training come from its record; an option that would
    // shape them is refused rather than ignored.
    std::string ignored;
    for (const std::string& flag : args.given)
      if (flag != "validate" && flag != "json") ignored += (ignored.empty() ? "--" : ", --") + flag;
    if (!ignored.empty())
      throw_error("plan: --validate predicts each run as its record and source say; drop ", ignored,
                  " (only --json goes with it)");
    return run_validate(args);
  }
  if (args.global_batch_tokens > 0) {
    if (args.global_batch_tokens % args.seq_len != 0)
      throw_error("plan: global batch of ", args.global_batch_tokens,
                  " tokens is not a whole number of ", args.seq_len, "-token sequences");
    args.global_batch = args.global_batch_tokens / args.seq_len;
  }
  if (args.model.empty()) throw_error("plan: give --model (a preset or a TOML file), or --validate FILE.json");
  const ModelConfig model = plan_model(args.model);
  if (args.layout.empty()) {
    if (args.offload_layers > 0)
      throw_error(
          "plan: --offload-layers evaluates one layout (the search does not offload); give "
          "--layout");
    return run_search(args, model);
  }
  const plan::PlanLayout layout = plan::parse_layout(args.layout);
  plan::check_layout(layout, model, args.seq_len);
  if (args.offload_layers > 0) {
    // Megatron-Core's rule for its cpu_offloading_num_layers (TransformerConfig checks).
    if (layout.pp != 1 || layout.recompute != Recompute::None)
      throw_error(
          "plan: --offload-layers needs pp=1 and recompute=none (offloading stands in for "
          "recomputation, one pipeline stage), not ",
          layout.describe());
    if (args.offload_layers >= model.n_layer)
      throw_error("plan: --offload-layers ", args.offload_layers,
                  " must be fewer than the model's ", model.n_layer,
                  " layers (Megatron-Core's rule)");
  }
  if (args.gpus != 0 && layout.gpus() != args.gpus)
    throw_error("plan: layout ", layout.describe(), " uses ", layout.gpus(), " GPUs, but --gpus (or cluster.gpus) is ", args.gpus);
  const int64_t per_step = layout.dp * layout.micro_batch;
  if (args.global_batch % per_step != 0)
    throw_error("plan: global batch ", args.global_batch, " sequences is not a multiple of dp x mbs = ", per_step);
  Machine machine = machine_of(args, layout.gpus());
  plan::TrainingJob& job = machine.job;
  std::string engine_note = plan::engine_note_on(plan_cluster(args, args.gpus_per_node).gpu, layout,
                                                 model, args.seq_len, job);
  if (args.offload_layers > 0)
    engine_note +=
        (engine_note.empty() ? "engine: not yet supported: " : ", ") +
        std::string("activation offloading (loom's trainer keeps activations on the device)");
  job.memory.micro_batches = args.global_batch / per_step;
  // Under a CPU --profile, the engine's own bytes on one rank (the first pipeline stage's): its
  // flats, buckets and activation sets as its allocator counts them; else the GPU model's.
  const bool engine_memory = machine.cpu_engine;
  const auto bucket_bytes = static_cast<int64_t>(TrainConfig{}.bucket_mb * 1e6);
  const plan::MemoryBreakdown mem =
      !engine_memory ? plan::predict_gpu_memory(model, layout, job.memory)
      : layout.pp > 1
          ? plan::predict_engine_pipeline_memory(model, layout, args.seq_len,
                                                 job.memory.micro_batches, bucket_bytes,
                                                 plan::moe_imbalance_of(model, job))
          : plan::predict_engine_memory(model, layout.dp * layout.cp, layout.zero_stage,
                                        bucket_bytes, false, layout.micro_batch, args.seq_len,
                                        layout.recompute, layout.tp, layout.sequence_parallel,
                                        layout.cp, layout.ep, plan::moe_imbalance_of(model, job));
  const plan::ClusterSpec& cluster = machine.cluster;
  const plan::GpuSpec& gpu = cluster.gpu;
  const plan::StepTime time = plan::predict_step_time(model, layout, cluster, job);
  // The stage split the prediction took, and what it was where a tuned run's (GPU presets).
  std::string split_note;
  const std::vector<int64_t> stage_layers =
      plan::planner_stage_layers(model, layout, job.memory, &split_note);
  // Offloaded activations must also fit in the GPU's share of its host's memory.
  const double host_bytes =
      args.offload_layers > 0 ? plan::offloaded_host_bytes(model, layout, job.memory) : 0.0;
  const double host_capacity = plan::host_memory_bytes_per_gpu(gpu);
  const bool host_fits = host_bytes <= host_capacity;
  const bool fits = mem.total() <= gpu.hbm_bytes * plan::kUsableMemoryFraction && host_fits;

  if (args.json) {
    nlohmann::json out = {{"model", args.model},
                          {"parameters", model.parameter_count()},
                          {"gpu", gpu.name},
                          {"layout", layout.describe()},
                          {"seq_len", args.seq_len},
                          {"global_batch", args.global_batch},
                          {"micro_batches", job.memory.micro_batches},
                          {"stage_layers", stage_layers},
                          {"finetune", args.finetune},
                          {"memory_bytes", memory_json(mem)},
                          {"memory_model", engine_memory ? "engine" : "gpu"},
                          {"time", time_json(time)},
                          {"hbm_bytes", gpu.hbm_bytes},
                          {"fits", fits},
                          {"engine_supported", engine_note.empty()},
                          {"engine_note", engine_note}};
    if (args.offload_layers > 0) {
      out["host_offload_bytes"] = host_bytes;
      out["host_memory_bytes"] = host_capacity;
    }
    std::printf("%s\n", out.dump(2).c_str());
    write_charts(args, {{layout, mem, time, engine_note}}, gpu.hbm_bytes * plan::kUsableMemoryFraction);
    return fits ? 0 : 1;
  }
  std::printf("model %s: %.2fB parameters | %s | %lld GPUs (%s) | seq %lld, global batch %lld, %lld micro-batches%s\n",
              args.model.c_str(), static_cast<double>(model.parameter_count()) / 1e9, layout.describe().c_str(),
              static_cast<long long>(layout.gpus()), gpu.name.c_str(), static_cast<long long>(args.seq_len),
              static_cast<long long>(args.global_batch), static_cast<long long>(job.memory.micro_batches),
              job.frozen_base ? " | LoRA: base weights frozen" : "");
  if (engine_memory)
    std::printf("\nmemory of the first pipeline stage's rank (loom's engine as its allocator counts it; comm buffers and "
                "workspace not itemised)\n");
  else
    std::printf("\nmemory of the most loaded GPU (first pipeline stage)\n");
  const std::pair<const char*, double> rows[] = {
      {"parameters", mem.parameters},         {"gradients", mem.gradients},       {"optimizer state", mem.optimizer_state},
      {"activations", mem.activations},       {"comm buffers", mem.comm_buffers}, {"workspace", mem.workspace}};
  for (const auto& [name, bytes] : rows) std::printf("  %-16s %9.2f GiB\n", name, bytes / kGiB);
  const bool hbm_fits = mem.total() <= gpu.hbm_bytes * plan::kUsableMemoryFraction;
  std::printf("  %-16s %9.2f GiB of %.0f GiB HBM (%.0f usable): %s\n", "total", mem.total() / kGiB,
              gpu.hbm_bytes / kGiB, gpu.hbm_bytes * plan::kUsableMemoryFraction / kGiB,
              hbm_fits ? "fits" : "does NOT fit");
  if (args.offload_layers > 0)
    std::printf("  %-16s %9.2f GiB of the host's %.0f GiB per GPU: %s\n", "offloaded",
                host_bytes / kGiB, host_capacity / kGiB, host_fits ? "fits" : "does NOT fit");
  if (!split_note.empty())
    std::printf(
        "pipeline: %s (a tuned run's split; loom's engine gives the first stages one more)\n",
        split_note.c_str());
  std::printf("\nstep %.3f s = compute %.3f + exposed communication %.3f + bubble %.3f + optimizer %.3f | %.0f tokens/s | MFU %.1f%%\n",
              time.total_s, time.compute_s, time.exposed_comm_s, time.bubble_s, time.optimizer_s, time.tokens_per_s,
              100 * time.mfu);
  if (args.offload_layers > 0)
    std::printf(
        "activations of %lld layers offloaded to host memory at %.0f GB/s each way: %.3f s of "
        "copies not "
        "hidden (in the exposed communication)\n",
        static_cast<long long>(args.offload_layers), plan::host_link_bytes_per_s(gpu) / 1e9,
        time.offload_s);
  if (!engine_note.empty()) {
    // The planner predicts any engine; this one would refuse the layout, with these reasons.
    std::printf("\n%s\n", engine_note.c_str());
    for (const LayoutProblem& p : layout_problems(layout, model, args.seq_len))
      if (p.level == LayoutRules::Engine) std::printf("  %s\n", p.message.c_str());
  }
  print_cluster(model, cluster, time, args);
  write_charts(args, {{layout, mem, time, engine_note}}, gpu.hbm_bytes * plan::kUsableMemoryFraction);
  return fits ? 0 : 1;
}

}  // namespace loom::cli
