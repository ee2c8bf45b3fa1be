#include "loom/cli/commands.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/cli/run_manifest.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/data/bpe_tokenizer.hpp"
#include "loom/data/tokenize_corpus.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/sampler.hpp"
#include "loom/train/trainer.hpp"

namespace loom::cli {

namespace {
BpeTokenizer load_tokenizer(const TokenizerArgs& args, const char* command) {
  if (args.tokenizer_dir.empty() == args.tokenizer.empty()) {
    throw_error(command, ": give one of --tokenizer-dir DIR (GPT-2's encoder.json and vocab.bpe) or ",
                "--tokenizer PATH (a Hugging Face tokenizer.json)");
  }
  if (!args.tokenizer.empty()) return BpeTokenizer::load(args.tokenizer);
  return BpeTokenizer::load_gpt2(args.tokenizer_dir + "/encoder.json", args.tokenizer_dir + "/vocab.bpe");
}

std::string read_stdin() {
  std::string text;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) text.append(buffer, got);
  if (std::ferror(stdin)) throw_error("cannot read standard input");
  return text;
}

std::unique_ptr<Transformer> load_model(const std::string& checkpoint) {
  auto model = std::make_unique<Transformer>(checkpoint_model_config(checkpoint));
  restore_weights(checkpoint, *model);
  return model;
}

void print_samples(Transformer& model, const BpeTokenizer& tokenizer, const std::string& prompt,
                   int64_t count, const SampleOptions& base) {
  const std::vector<int32_t> prompt_tokens = tokenizer.encode(prompt);
  for (int64_t i = 0; i < count; ++i) {
    SampleOptions options = base;
    options.seed = base.seed + static_cast<uint64_t>(i);
    // A model trained on loom's shards saw this token between documents.
    options.stop_token = tokenizer.has_document_token() ? tokenizer.document_token() : -1;
    const auto tokens = sample_tokens(model, prompt_tokens, options);
    std::printf("--- sample %lld ---\n%s%s\n", static_cast<long long>(i + 1), prompt.c_str(),
                tokenizer.decode(tokens).c_str());
  }
}

// What follows every run: the validation loss against the unigram baseline, and samples.
void report_trained_model(const TrainConfig& config, const TrainSummary& summary, Transformer& model) {
  if (summary.last_val_loss && summary.unigram_baseline) {
    const double unigram = *summary.unigram_baseline;
    std::printf("validation loss %.4f vs unigram baseline %.4f nats/token (%.1f%% below)\n",
                *summary.last_val_loss, unigram, 100.0 * (1.0 - *summary.last_val_loss / unigram));
  }
  const bool partial_model = !model.is_whole() || model.plan().tp() > 1 || model.plan().expert_exchange() != nullptr;
  if (config.sample_tokens > 0 && !config.sample_prompt.empty() && partial_model) {
    // Sampling runs on rank 0 alone, which holds a pipeline stage, a tensor-parallel shard or
    // some of the experts.
    std::printf("no samples: this rank holds part of the model; run `loom generate` on the last checkpoint\n");
  } else if (config.sample_tokens > 0 && !config.sample_prompt.empty()) {
    const BpeTokenizer tokenizer = BpeTokenizer::load(config.tokenizer_dir);
    SampleOptions options;
    options.new_tokens = config.sample_tokens;
    options.temperature = config.sample_temperature;
    options.top_k = config.sample_top_k;
    options.seed = config.seed;
    print_samples(model, tokenizer, config.sample_prompt, config.sample_count, options);
  }
}

// parallel.backend resolved for this launch: NCCL needs CUDA and a GPU per rank of the node
// (NCCL refuses two ranks on one device); MPI carries device tensors through host memory.
bool use_nccl(const TrainConfig& config, const DistRuntime& runtime) {
  if (config.backend == CommBackend::Mpi || config.device != Device::CUDA) return false;
  const int gpus = device_memory::cuda_device_count(), ranks = runtime.local_size();
  if (config.backend == CommBackend::Auto) return DistRuntime::nccl_built() && ranks <= gpus;
  if (ranks > gpus)
    throw_error("parallel.backend = \"nccl\": ", ranks, " ranks on this node share ", gpus,
                " GPU(s), and NCCL needs one GPU per rank; launch at most ", gpus,
                " ranks per node or use parallel.backend = \"mpi\" (or \"auto\")");
  return true;
}

}  // namespace

int run_train(const TrainArgs& args) {
  ConfigReader reader = ConfigReader::from_file(args.config_path);
  reader.apply_overrides(args.overrides);
  if (!args.device.empty()) reader.apply_overrides({"train.device=\"" + args.device + "\""});
  TrainConfig config = parse_train_config(reader);
  config.print_schedule = args.print_schedule;
  if (config.device == Device::CUDA && !device_memory::built_with(Device::CUDA) && args.check_only)
    std::printf("note: config %s asks for train.device = \"cuda\", which this loom (built without CUDA) cannot run\n",
                args.config_path.c_str());
  if (args.check_only) {
    std::printf("config %s is valid\n", args.config_path.c_str());
    return 0;
  }
  // Under a launcher every CUDA rank computes on GPU local_rank % the node's GPUs.
  if (config.device == Device::CUDA) check_cuda_available();
  // Under mpirun or srun the ranks form the layout's mesh; alone, no MPI at all.
  std::unique_ptr<DistRuntime> runtime;
  if (DistRuntime::launched_by_mpi_or_slurm()) runtime = std::make_unique<DistRuntime>();
  const bool rank0 = !runtime || runtime->world_rank() == 0;
  if (config.device == Device::CUDA) (void)device_memory::select_cuda_device(runtime ? runtime->local_rank() : 0);
  std::shared_ptr<ProcessGroup> world;
  if (runtime && runtime->world_size() > 1)
    world = use_nccl(config, *runtime) ? runtime->nccl_world() : runtime->world();
  Trainer trainer(config, world);
  // What `loom report` says about the run, next to its metrics.
  if (rank0)
    write_run_manifest(config, args.config_path, trainer.global_tokens_per_step() / config.tokens_per_step(),
                       runtime ? runtime->world_size() : 1);
  const TrainSummary summary = trainer.run();
  if (!rank0) return 0;
  report_trained_model(config, summary, trainer.model());
  return 0;
}

int run_tokenize(const TokenizeArgs& args) {
  std::vector<std::string> files;
  for (const std::string& input : args.inputs) {
    if (std::filesystem::is_directory(input)) {
      for (const auto& entry : std::filesystem::directory_iterator(input))
        if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
    } else if (std::filesystem::is_regular_file(input)) {
      files.push_back(input);
    } else {
      throw_error("tokenize: input '", input, "' is neither a file nor a directory");
    }
  }
  std::sort(files.begin(), files.end());  // a stable document order, whatever the filesystem
  if (files.empty()) throw_error("tokenize: no input files found");
  // tokenize_corpus holds out the last documents. Move an evenly spaced subset to the end so
  // the held-out text spans the corpus (for dated documents: every era, not only the latest).
  // The count matches tokenize_corpus's own: ceil(fraction x documents), at least one.
  if (args.val_fraction > 0 && files.size() > 1) {
    const size_t n = files.size();
    const size_t held_out = std::clamp<size_t>(
        static_cast<size_t>(std::ceil(args.val_fraction * static_cast<double>(n) - 1e-9)), 1, n - 1);
    std::vector<bool> is_val(n, false);
    for (size_t k = 0; k < held_out; ++k) is_val[(2 * k + 1) * n / (2 * held_out)] = true;
    std::vector<std::string> train_part, val_part;
    for (size_t i = 0; i < n; ++i) (is_val[i] ? val_part : train_part).push_back(files[i]);
    train_part.insert(train_part.end(), val_part.begin(), val_part.end());
    files = std::move(train_part);
  }
  const BpeTokenizer tokenizer = load_tokenizer(args, "tokenize");
  std::optional<int32_t> document_token;
  if (!args.document_token.empty()) {
    document_token = tokenizer.token_id(args.document_token);
    if (!document_token)
      throw_error("tokenize: --document-token '", args.document_token, "' is not a token of '", tokenizer.source(), "'");
  } else {
    document_token = tokenizer.document_token();  // or a clear error naming the file
  }
  const auto parent = std::filesystem::path(args.output_prefix).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const TokenizeResult result =
      tokenize_corpus(files, tokenizer, args.output_prefix, args.val_fraction, args.shard_tokens, document_token);
  std::printf("tokenized %lld documents: %lld train tokens, %lld val tokens\n",
              static_cast<long long>(result.documents), static_cast<long long>(result.train_tokens),
              static_cast<long long>(result.val_tokens));
  for (const auto& f : result.files_written) std::printf("  wrote %s\n", f.c_str());
  return 0;
}

int run_generate(const GenerateArgs& args) {
  const BpeTokenizer tokenizer = load_tokenizer(args, "generate");
  auto model = load_model(args.checkpoint);
  if (model->config().vocab_size != tokenizer.vocab_size())
    throw_error("generate: the checkpoint's vocabulary has ", model->config().vocab_size,
                " tokens but the tokenizer has ", tokenizer.vocab_size());
  SampleOptions options;
  options.new_tokens = args.tokens;
  options.temperature = args.temperature;
  options.top_k = args.top_k;
  options.seed = args.seed;
  print_samples(*model, tokenizer, args.prompt, args.count, options);
  return 0;
}

int run_encode(const EncodeArgs& args) {
  const BpeTokenizer tokenizer = load_tokenizer(args, "encode");
  const std::string text = read_stdin();
  EncodeOptions options;
  options.add_special_tokens = args.add_special_tokens;
  options.recognise_added_tokens = !args.plain_added_tokens;
  const std::vector<int32_t> tokens = tokenizer.encode(text, options);
  std::string json = "[";
  char number[16];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) json += ',';
    json.append(number, std::to_chars(number, number + sizeof(number), tokens[i]).ptr);
  }
  json += "]\n";
  std::fwrite(json.data(), 1, json.size(), stdout);
  return 0;
}

int run_decode(const DecodeArgs& args) {
  const BpeTokenizer tokenizer = load_tokenizer(args, "decode");
  std::vector<int32_t> tokens;
  try {
    tokens = nlohmann::json::parse(read_stdin()).get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw_error("decode: standard input is not a JSON array of token ids: ", e.what());
  }
  const std::string text = tokenizer.decode(tokens);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int run_eval(const EvalArgs& args) {
  auto model = load_model(args.checkpoint);
  DataLoader loader = DataLoader::from_pattern(args.data, args.batch_size, args.seq_len, model->config().vocab_size);
  loader.set_shuffle(kEvalShuffleSeed);
  std::vector<int32_t> inputs(static_cast<size_t>(args.batch_size * args.seq_len)), targets(inputs.size());
  double total = 0.0;
  for (int64_t b = 0; b < args.batches; ++b) {
    loader.next_batch(inputs.data(), targets.data());
    total += model->forward(inputs.data(), targets.data(), args.batch_size, args.seq_len, {false, 1.0f});
  }
  const double loss = total / static_cast<double>(args.batches * args.batch_size * args.seq_len);
  std::printf("eval loss %.4f nats/token (perplexity %.2f) over %lld tokens\n", loss, std::exp(loss),
              static_cast<long long>(args.batches * args.batch_size * args.seq_len));
  return 0;
}

int run_export(const ExportArgs& args) {
  export_hf_checkpoint(args.checkpoint, args.out_dir, args.dtype == "bf16" ? DType::BF16 : DType::F32);
  std::printf("wrote %s/model.safetensors and config.json (Hugging Face layout, %s)\n", args.out_dir.c_str(),
              args.dtype.c_str());
  return 0;
}

}  // namespace loom::cli
