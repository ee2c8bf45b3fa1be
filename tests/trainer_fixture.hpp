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

// Largest difference relative to the tensor's largest weight, floored at the init scale (std
// 0.02): biases start at zero, and their own maximum after a few small steps is no scale.
inline double relative_weight_difference(const std::vector<float>& a, const std::vector<float>& b) {
  constexpr double kInitScale = 0.02;
  double max_diff = 0, max_ref = kInitScale;
  for (size_t k = 0; k < a.size(); ++k) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[k] - b[k])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(a[k])));
  }
  return max_diff / max_ref;
}

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
