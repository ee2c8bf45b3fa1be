#pragma once
// One function per `loom` subcommand; main.cpp only parses arguments and dispatches.
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loom/train/trainer.hpp"

namespace loom::cli {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;  // "section.key=value"
  bool check_only = false;             // validate the config and exit
  bool print_schedule = false;  // pipeline runs: draw the last step and report its bubble
  std::string device;           // --device cpu|cuda: overrides train.device; empty keeps it
};
int run_train(const TrainArgs& args);

// --tokenizer-dir DIR (GPT-2's encoder.json + vocab.bpe) or --tokenizer PATH (a tokenizer.json,
// or a directory holding one or GPT-2's files); exactly one is given.
struct TokenizerArgs {
  std::string tokenizer_dir;
  std::string tokenizer;
};

struct TokenizeArgs : TokenizerArgs {
  std::vector<std::string> inputs;  // files, or directories whose *.txt files are read
  std::string document_token;       // text of the token before each document; "": the file's default
  std::string output_prefix;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
};
int run_tokenize(const TokenizeArgs& args);

// `loom encode`: UTF-8 text on stdin, a JSON array of ids on stdout.
struct EncodeArgs : TokenizerArgs {
  bool add_special_tokens = false;  // the post-processor's template (Llama 3's later files: BOS)
  bool plain_added_tokens = false;  // "<|end_of_text|>" in the text as characters, not the token
};
int run_encode(const EncodeArgs& args);

// `loom decode`: a JSON array of ids on stdin, the text (raw bytes) on stdout.
struct DecodeArgs : TokenizerArgs {};
int run_decode(const DecodeArgs& args);

struct GenerateArgs : TokenizerArgs {
  std::string checkpoint;
  std::string prompt;
  int64_t tokens = 64;
  int64_t count = 1;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 1;
};
int run_generate(const GenerateArgs& args);

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  int64_t batch_size = 4;
  int64_t seq_len = 64;
  int64_t batches = 10;
};
int run_eval(const EvalArgs& args);

struct ExportArgs {
  std::string checkpoint;
  std::string out_dir;
  std::string dtype = "f32";  // "f32" or "bf16"
};
int run_export(const ExportArgs& args);

// Cluster properties a plan file may set beyond the GPU preset and the GPU count; unset ones
// keep the preset's or ClusterSpec's documented defaults.
struct PlanClusterSettings {
  std::optional<double> bf16_tflops, hbm_gib, hbm_tb_per_s, nvlink_gb_per_s, tdp_watts;
  std::optional<double> inter_node_gbit_per_gpu, pue, node_overhead_watts, storage_write_gb_per_s;
  std::optional<double> restart_seconds, price_per_gpu_hour, gpu_mtbf_hours, node_mtbf_hours;
};

struct PlanArgs {
  std::string config;              // TOML with [model], [cluster], [training], [plan]; flags override it
  std::set<std::string> given;     // options given on the command line ("gpus", "seq", ...)
  PlanClusterSettings cluster;
  std::string attention = "flash";  // or "materialized": attention that stores the s x s scores
  int64_t global_batch_tokens = 0;  // > 0: the global batch in tokens (a multiple of the sequence)
  std::string model;               // preset name or a TOML file with a [model] table
  std::string gpu = "h100-sxm";
  std::string layout;              // "tp=2,pp=4,dp=8,zero=1,mbs=1,recompute=selective"; empty: search
  int64_t gpus = 0;                // with --layout, 0: whatever the layout uses; the search needs it
  int64_t gpus_per_node = 8;
  double train_tokens = 0;         // > 0: also print the cluster estimate for training this many tokens
  double moe_imbalance = 1.0;      // the busiest expert-parallel rank's routed rows over the mean
  std::string finetune = "full";   // or "lora": the base weights frozen (TrainingJob::frozen_base)
  int64_t offload_layers =
      0;  // with --layout: layers whose activations live in host memory (GpuJob::offloaded_layers)
  int top = 10;                    // rows of the search table
  int64_t seq_len = 4096;
  int64_t global_batch = 512;      // sequences per optimizer step
  std::string precision = "bf16";  // "bf16" (mixed, fp32 masters) or "f32"
  // With precision fp8 and a CPU profile: loom's engine's recipe (delayed, current, blockwise).
  std::string fp8_recipe = "delayed";
  bool json = false;
  std::string gemm_timings;        // CSV m,n,k,seconds measured on the GPU: replaces the default efficiency
  std::string svg_dir;             // write memory.svg (candidates) and timeline.svg (the chosen layout) here
  std::string validate;            // a published-runs JSON file: predict each run, print the errors
  std::string profile;  // a machine profile (`loom calibrate`): predict loom's own engine there
};
// Exit code 0 when the layout fits (or the search found one), 1 when it does not.
int run_plan(const PlanArgs& args);

// `loom calibrate`: measures this machine for the planner (plan/machine_calibration) with every
// rank of the launch working at once, and adds the entry for this rank count to `out`
// (created, or merged into an existing profile of the same machine and device). Run once per
// rank count: `mpirun -np N loom calibrate [--device cuda] --out profile.json`.
struct CalibrateArgs {
  std::string out;
  bool quick = false;
  int threads = 1;             // kernel threads per rank (the CPU engine's)
  std::string device = "cpu";  // --device cpu|cuda: the engine measured
};
int run_calibrate(const CalibrateArgs& args);

// `loom report`: one self-contained HTML page of training runs (their run.json, metrics.jsonl
// and pipeline.svg): a header per run, a chart per metric with the runs overlaid, timelines.
struct ReportArgs {
  std::vector<std::string> run_dirs;  // log.dir of each run, as given
  std::string output = "report.html";
};
// Every run directory is read and checked before the page is written (atomically).
int run_report(const ReportArgs& args);

}  // namespace loom::cli
