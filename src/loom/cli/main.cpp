// `loom`: train, tokenize, encode, decode, generate, eval, export, launch, plan, calibrate, report. Errors in user input end with exit code 2 and one
// line naming the problem; nothing is written before the input has been validated.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "loom/cli/commands.hpp"
#include "loom/core/allocator.hpp"
#include "loom/core/error.hpp"
#include "loom/train/launch.hpp"

namespace {
void add_tokenizer_options(CLI::App* command, loom::cli::TokenizerArgs& args) {
  auto* dir = command->add_option("--tokenizer-dir", args.tokenizer_dir, "directory with GPT-2's encoder.json and vocab.bpe");
  command->add_option("--tokenizer", args.tokenizer,
                      "a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, ...), or a directory holding one")
      ->excludes(dir);
}
}  // namespace

int main(int argc, char** argv) {
  loom::retain_freed_host_memory();
  CLI::App app{"loom: train GPT-2 and Llama-style language models"};
  app.require_subcommand(1);

  loom::cli::TrainArgs train;
  auto* train_cmd = app.add_subcommand("train", "train a model from a TOML config; extra --section.key=value override it");
  train_cmd->add_option("config", train.config_path, "TOML config file")->required()->check(CLI::ExistingFile);
  train_cmd->add_flag("--check", train.check_only, "validate the config and exit");
  train_cmd->add_flag("--print-schedule", train.print_schedule,
                      "draw the last step's pipeline timeline (log.dir/pipeline.svg) and print its bubble");
  std::string trace_path;
  train_cmd->add_option("--trace", trace_path, "write a Chrome/Perfetto trace (one file per rank)");
  train_cmd->add_option("--device", train.device, "cpu or cuda: where to train (overrides train.device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train_cmd->allow_extras();

  loom::cli::TokenizeArgs tokenize;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "encode text files with a byte-level BPE into llm.c .bin token shards");
  tokenize_cmd->add_option("inputs", tokenize.inputs, "text files or directories of *.txt")->required();
  add_tokenizer_options(tokenize_cmd, tokenize);
  tokenize_cmd->add_option("--document-token", tokenize.document_token,
                           "text of the token put before each document (default: the file's BOS, else <|endoftext|>)");
  tokenize_cmd->add_option("--output", tokenize.output_prefix, "output prefix, e.g. data/sotu/sotu")->required();
  tokenize_cmd->add_option("--val-fraction", tokenize.val_fraction, "fraction of documents held out")->check(CLI::Range(0.0, 0.9));
  tokenize_cmd->add_option("--shard-tokens", tokenize.shard_tokens, "tokens per shard")->check(CLI::PositiveNumber);

  loom::cli::GenerateArgs generate;
  auto* generate_cmd = app.add_subcommand("generate", "sample text from a checkpoint");
  generate_cmd->add_option("--checkpoint", generate.checkpoint, "checkpoint directory or root")->required();
  add_tokenizer_options(generate_cmd, generate);
  generate_cmd->add_option("--prompt", generate.prompt, "text to continue")->required();
  generate_cmd->add_option("--tokens", generate.tokens, "new tokens per sample")->check(CLI::PositiveNumber);
  generate_cmd->add_option("--count", generate.count, "number of samples")->check(CLI::PositiveNumber);
  generate_cmd->add_option("--temperature", generate.temperature, "softmax temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  generate_cmd->add_option("--top-k", generate.top_k, "sample among the k most likely tokens (0 = all)");
  generate_cmd->add_option("--seed", generate.seed, "random seed");

  loom::cli::EncodeArgs encode;
  auto* encode_cmd = app.add_subcommand("encode", "encode UTF-8 text from stdin; print the token ids as a JSON array");
  add_tokenizer_options(encode_cmd, encode);
  encode_cmd->add_flag("--add-special-tokens", encode.add_special_tokens,
                       "apply the tokenizer.json post-processor's template (e.g. Llama 3's BOS)");
  encode_cmd->add_flag("--plain-added-tokens", encode.plain_added_tokens,
                       "encode the text of added tokens (\"<|end_of_text|>\") as ordinary characters");

  loom::cli::DecodeArgs decode;
  auto* decode_cmd = app.add_subcommand("decode", "decode a JSON array of token ids from stdin; print the text");
  add_tokenizer_options(decode_cmd, decode);

  loom::cli::EvalArgs eval;
  auto* eval_cmd = app.add_subcommand("eval", "mean loss of a checkpoint on token shards");
  eval_cmd->add_option("--checkpoint", eval.checkpoint, "checkpoint directory or root")->required();
  eval_cmd->add_option("--data", eval.data, "glob of token shards")->required();
  eval_cmd->add_option("--batch-size", eval.batch_size)->check(CLI::PositiveNumber);
  eval_cmd->add_option("--seq-len", eval.seq_len)->check(CLI::PositiveNumber);
  eval_cmd->add_option("--batches", eval.batches)->check(CLI::PositiveNumber);

  loom::cli::ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "write any checkpoint (sharded or not) as one Hugging Face safetensors file");
  export_cmd->add_option("--checkpoint", export_args.checkpoint, "checkpoint directory or root")->required();
  export_cmd->add_option("--out", export_args.out_dir, "output directory (model.safetensors, config.json)")->required();
  export_cmd->add_option("--dtype", export_args.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));

  loom::LaunchOptions launch;
  auto* launch_cmd = app.add_subcommand(
      "launch", "run a training command and relaunch it when it fails; each relaunch resumes from the newest checkpoint");
  launch_cmd->add_option("--max-restarts", launch.max_restarts, "relaunches before giving up (default 3)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("--backoff", launch.backoff_s, "seconds before the first relaunch, doubled each time (default 5)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("command", launch.command, "the command after --, e.g. -- mpirun -np 8 loom train run.toml")
      ->required();

  loom::cli::PlanArgs plan_args;
  auto* plan_cmd = app.add_subcommand("plan", "find the best layout for a model on a cluster, or evaluate one (--layout)");
  plan_cmd->add_option("--model", plan_args.model, "model preset or TOML config with a [model] table");
  plan_cmd->add_option("--gpu", plan_args.gpu, "GPU preset: v100-32gb, v100-16gb, a100-40gb, a100-80gb, a800-80gb, h100-sxm, h100-pcie, h100-nvl, h800-sxm, h200, gh200, gh200-144gb, h20, b200, b300, gb200, gb300, mi250x, mi250 (one GCD), mi300x, mi325x, mi350x, mi355x");
  plan_cmd->add_option("--layout", plan_args.layout, "evaluate one layout, e.g. tp=2,pp=4,dp=8,zero=1,mbs=1,recompute=selective,sp=1");
  plan_cmd->add_option("--gpus", plan_args.gpus, "GPU count (required to search)")->check(CLI::NonNegativeNumber);
  plan_cmd->add_option("--gpus-per-node", plan_args.gpus_per_node, "GPUs per NVLink node")->check(CLI::PositiveNumber);
  plan_cmd->add_option("--train-tokens", plan_args.train_tokens, "tokens to train: adds power, failures, checkpoints, time")->check(CLI::NonNegativeNumber);
  plan_cmd->add_option("--top", plan_args.top, "rows of the search table")->check(CLI::PositiveNumber);
  plan_cmd->add_option("--seq", plan_args.seq_len, "sequence length")->check(CLI::PositiveNumber);
  plan_cmd->add_option("--global-batch", plan_args.global_batch, "sequences per optimizer step")->check(CLI::PositiveNumber);
  plan_cmd
      ->add_option(
          "--precision", plan_args.precision,
          "bf16, fp8 (FP8 Linear GEMMs, Transformer Engine's recipe), mxfp8 (the same with a scale "
          "per 32 elements, Blackwell), nvfp4 (4-bit Linear GEMMs on Blackwell) or f32")
      ->check(CLI::IsMember({"bf16", "fp8", "mxfp8", "nvfp4", "f32"}));
  plan_cmd
      ->add_option("--fp8-recipe", plan_args.fp8_recipe,
                   "with --precision fp8 and a CPU --profile: the recipe loom's engine trains "
                   "(train.fp8_recipe): delayed, current or blockwise")
      ->check(CLI::IsMember({"delayed", "current", "blockwise"}));
  plan_cmd->add_flag("--json", plan_args.json, "print JSON instead of a table");
  plan_cmd->add_option("--gemm-timings", plan_args.gemm_timings, "CSV of measured GEMMs (m,n,k,seconds) to calibrate the time model")
      ->check(CLI::ExistingFile);
  plan_cmd->add_option("--svg", plan_args.svg_dir, "directory for memory.svg (per candidate) and timeline.svg (the pipeline of the chosen layout)");
  plan_cmd->add_option("--config", plan_args.config, "TOML with [model], [cluster], [training], [plan]; flags override it")
      ->check(CLI::ExistingFile);
  plan_cmd->add_option("--global-batch-tokens", plan_args.global_batch_tokens, "global batch in tokens (instead of --global-batch)")
      ->check(CLI::PositiveNumber);
  plan_cmd->add_option("--moe-imbalance", plan_args.moe_imbalance,
                       "mixture of experts under ep: the busiest rank's routed rows over the mean (>= 1; loom train "
                       "logs moe_load_max_over_mean)")
      ->check(CLI::Range(1.0, 1e6));
  plan_cmd->add_option("--finetune", plan_args.finetune,
                       "full (every weight trains, as pre-training) or lora (the base weights frozen: input "
                       "gradients only, no gradients, optimizer state or gradient reduction for them)")
      ->check(CLI::IsMember({"full", "lora"}));
  plan_cmd
      ->add_option(
          "--offload-layers", plan_args.offload_layers,
          "with --layout at pp 1 and no recomputation: keep this many layers' activations in host "
          "memory (Megatron-Core's cpu_offloading_num_layers), copied over the host link")
      ->check(CLI::NonNegativeNumber);
  plan_cmd->add_option("--attention", plan_args.attention, "flash, or materialized (the s x s scores are stored)")
      ->check(CLI::IsMember({"flash", "materialized"}));
  plan_cmd->add_option("--validate", plan_args.validate, "predict each published run in this JSON file and print the errors")
      ->check(CLI::ExistingFile);

  plan_cmd
      ->add_option(
          "--profile", plan_args.profile,
          "machine profile from `loom calibrate`: predict loom's own engine (CPU, or CUDA for a "
          "--device cuda profile) on that machine")
      ->check(CLI::ExistingFile);

  loom::cli::CalibrateArgs calibrate;
  auto* calibrate_cmd = app.add_subcommand(
      "calibrate", "measure this machine (GEMM, attention, memory, MPI) for `loom plan --profile`; run under mpirun -np N");
  calibrate_cmd->add_option("--out", calibrate.out, "profile JSON to create or add this rank count to")->required();
  calibrate_cmd->add_flag("--quick", calibrate.quick, "fewer shapes and sizes: a rough profile in seconds");
  calibrate_cmd
      ->add_option("--threads", calibrate.threads, "CPU kernel threads per rank (default 1)")
      ->check(CLI::PositiveNumber);
  calibrate_cmd
      ->add_option(
          "--device", calibrate.device,
          "cpu (default: the CPU engine, f32) or cuda (the CUDA engine in bf16 on this rank's GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  loom::cli::ReportArgs report;
  auto* report_cmd = app.add_subcommand(
      "report", "write one self-contained HTML page of training runs: config, metric charts (runs overlaid), pipeline timeline");
  report_cmd->add_option("run_dirs", report.run_dirs, "run directories (a training run's log.dir, holding metrics.jsonl)")
      ->required();
  report_cmd->add_option("-o,--output", report.output, "the HTML file to write (default report.html)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; every real argument error exits 2.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (train_cmd->parsed()) {
      train.overrides = train_cmd->remaining();
      if (!trace_path.empty()) train.overrides.push_back("log.trace=\"" + trace_path + "\"");
      return loom::cli::run_train(train);
    }
    if (tokenize_cmd->parsed()) return loom::cli::run_tokenize(tokenize);
    if (generate_cmd->parsed()) return loom::cli::run_generate(generate);
    if (encode_cmd->parsed()) return loom::cli::run_encode(encode);
    if (decode_cmd->parsed()) return loom::cli::run_decode(decode);
    if (eval_cmd->parsed()) return loom::cli::run_eval(eval);
    if (export_cmd->parsed()) return loom::cli::run_export(export_args);
    if (launch_cmd->parsed()) return loom::launch_with_restarts(launch);
    if (report_cmd->parsed()) return loom::cli::run_report(report);
    if (calibrate_cmd->parsed()) return loom::cli::run_calibrate(calibrate);
    if (plan_cmd->parsed()) {
      for (const CLI::Option* option : plan_cmd->get_options())
        if (option->count() > 0 && !option->get_lnames().empty()) plan_args.given.insert(option->get_lnames().front());
      return loom::cli::run_plan(plan_args);
    }
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom: error: %s\n", e.what());
    loom::report_launch_failure(e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: unexpected error: %s\n", e.what());
    loom::report_launch_failure(std::string("unexpected error: ") + e.what());
    return 3;
  }
  return 0;
}
