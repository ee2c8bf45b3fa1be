#pragma once
// A temporary directory with tiny random token shards and a config that trains a tiny model
// on them: the trainer, resume and CLI tests all start from here.
#include <filesystem>
#include <string>

#include "loom/data/token_shard.hpp"
#include "model_fixtures.hpp"
#include "test_support.hpp"

namespace loom::test {

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
