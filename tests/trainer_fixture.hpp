#pragma once
// A temporary directory with tiny random token shards and a config that trains a tiny model
// on them: the trainer, resume and CLI tests all start from here.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "loom/data/token_shard.hpp"
#include "loom/obs/metrics_log.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {

// The training losses of a run's metrics.jsonl, step by step.
inline std::vector<double> losses_of(const std::string& metrics_path) {
  std::vector<double> out;
  for (const auto& r : MetricsLog::read_all(metrics_path))
    if (r["kind"] == "train") out.push_back(r["loss"].get<double>());
  return out;
}

// What weight differences are measured against: the tensor's largest weight, floored at the
// init scale (std 0.02): biases start at zero, and their own maximum after a few small steps is
// no scale.
inline double weight_scale(const std::vector<float>& a) {
  constexpr double kInitScale = 0.02;
  double max_ref = kInitScale;
  for (float v : a) max_ref = std::max(max_ref, static_cast<double>(std::fabs(v)));
  return max_ref;
}

// Largest difference relative to weight_scale.
inline double relative_weight_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double max_diff = 0;
  for (size_t k = 0; k < a.size(); ++k)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[k] - b[k])));
  return max_diff / weight_scale(a);
}

// A token stream with something to learn: a first-order Markov chain in which token t is
// followed by (5t + 3) mod V or by that plus V/2, chosen by a fair coin. A model that learns
// the 2-way successor table reaches ln 2 = 0.69 nats per token from ln V at initialisation
// (4.16 for V = 64); uniform random tokens (random_tokens) leave nothing to learn, so a loss
// comparison on them passes whatever the arithmetic does.
inline std::vector<int32_t> markov_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  CounterRng rng(seed, 7);
  std::vector<int32_t> out(static_cast<size_t>(n));
  int64_t token = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = static_cast<int32_t>(token);
    const int64_t coin = static_cast<int64_t>(rng.bits(static_cast<uint64_t>(i)) >> 63);
    token = (5 * token + 3 + coin * (vocab / 2)) % vocab;
  }
  return out;
}

// On those streams, kLearnableSteps steps at kLearnableLr take the tiny GPT-2 and Llama of
// TinyRun::config from ln 64 = 4.16 to 1.2-1.4 nats per token, in f32 and in bf16.
inline constexpr int64_t kLearnableSteps = 30;
inline constexpr const char* kLearnableLr = "optim.lr=1e-2";

struct TinyRun {
  std::string dir;
  explicit TinyRun(const std::string& name, int64_t vocab = 64) {
    dir = (std::filesystem::temp_directory_path() / ("loom_" + name + "_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir + "/data");
    write_token_shard(dir + "/data/tiny_train_000000.bin", random_tokens(3000, vocab, 11));
    write_token_shard(dir + "/data/tiny_train_000001.bin", random_tokens(2000, vocab, 12));
    write_token_shard(dir + "/data/tiny_val_000000.bin", random_tokens(1000, vocab, 13));
  }
  ~TinyRun() { std::filesystem::remove_all(dir); }

  // Replaces the random shards with markov_tokens streams of the same sizes (train and val).
  void write_learnable_shards(int64_t vocab = 64) const {
    write_token_shard(dir + "/data/tiny_train_000000.bin", markov_tokens(3000, vocab, 11));
    write_token_shard(dir + "/data/tiny_train_000001.bin", markov_tokens(2000, vocab, 12));
    write_token_shard(dir + "/data/tiny_val_000000.bin", markov_tokens(1000, vocab, 13));
  }

  std::string config(const std::string& arch = "gpt2", int64_t steps = 20) const {
    return "[model]\narch = \"" + arch + "\"\nvocab_size = 64\nmax_seq_len = 16\nn_layer = 2\n"
           "n_embd = 32\nn_head = 4\n" + (arch == "llama" ? "n_kv_head = 2\nffn_hidden = 48\ntied_embeddings = false\n" : "") +
           "[data]\ntrain = \"" + dir + "/data/tiny_train_*.bin\"\nval = \"" + dir + "/data/tiny_val_*.bin\"\n"
           "[train]\nbatch_size = 4\nseq_len = 16\ngrad_accum = 2\nsteps = " + std::to_string(steps) + "\nthreads = 2\n"
           "[optim]\nlr = 3e-3\nwarmup_steps = 3\n"
           "[eval]\nevery = 5\nbatches = 2\n"
           "[checkpoint]\ndir = \"" + dir + "/ckpt\"\nevery = 5\nkeep_last = 3\n"
           "[log]\ndir = \"" + dir + "/run\"\nevery = 100\n";
  }
  std::string write_config(const std::string& text, const std::string& name = "config.toml") const {
    const std::string path = dir + "/" + name;
    write_text_file(path, text);
    return path;
  }
};

}  // namespace loom::test
