#pragma once
// Everything a training run needs, read from TOML (+ overrides) and validated as a whole
// before any work starts. configs/*.toml document each key.
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/data/data_loader.hpp"
#include "loom/model/config.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/context_parallel.hpp"
#include "loom/parallel/parallel_layout.hpp"
#include "loom/parallel/pipeline_schedule.hpp"
#include "loom/train/bad_steps.hpp"
#include "loom/train/config_reader.hpp"
#include "loom/train/lr_schedule.hpp"

namespace loom {

// f32; bf16 mixed precision (fp32 masters); fp8: the linear layers' GEMMs on FP8 operands
// (model/fp8_linear.hpp), everything else f32, masters f32.
enum class Precision { F32, BF16, FP8 };
const char* precision_name(Precision precision);  // "f32", "bf16", "fp8"

// Who carries a launch's collectives. Auto: NCCL when training on CUDA with a loom built with
// NCCL and a GPU for every rank of the node, else MPI (which stages device tensors through
// host memory, so ranks may share a GPU); pipelines (pp > 1) always take MPI, whose tagged
// transfers the executor's send/recv order relies on. NCCL: required (refused, saying why,
// where it cannot run). MPI: always MPI.
enum class CommBackend { Auto, Mpi, Nccl };

struct TrainConfig {
  ModelConfig model;
  Recompute recompute = Recompute::None;

  std::string train_data;      // glob of token shards (data.train: one source)
  // What the loader reads: data.train as one source of weight 1, or the [[data.sources]]
  // tables (path + weight), mixed by weight.
  std::vector<DataSource> train_sources;
  std::string val_data;        // glob of token shards (optional)
  std::string tokenizer_dir;   // for samples: tokenizer.json, or a directory of it or of encoder.json + vocab.bpe
  bool shuffle = true;         // train batches from shuffled sequence slots (seeded)
  bool document_mask = false;  // packed documents: attention stops at each eot_token
  int32_t eot_token = 50256;   // the end-of-document token (GPT-2's <|endoftext|>)
  bool document_positions = false;  // positions restart at each document's first token
  // With document_mask, a document longer than seq_len is refused before training unless this
  // is set: then it is cut at row boundaries and its pieces train apart (Llama 3's packing).
  bool split_long_documents = false;

  int64_t batch_size = 4;      // sequences per micro-batch
  int64_t seq_len = 64;
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  int64_t steps = 100;
  uint64_t seed = 1337;
  Precision precision = Precision::F32;
  Fp8Config fp8;               // train.fp8_*: read when precision is fp8
  int threads = 0;             // 0: all cores
  Device device = Device::CPU; // where the model trains: the CPU reference, or one CUDA GPU
  int64_t vocab_chunk = 0;     // 0: chosen for the device (resolved_vocab_chunk)

  LrSchedule schedule;
  AdamWConfig adamw;
  double grad_clip = 1.0;

  double bucket_mb = 25.0;     // data-parallel gradient bucket size (PyTorch DDP's default)
  CommBackend backend = CommBackend::Auto;  // parallel.backend: who carries the collectives
  int zero_stage = 0;          // 0: replicated; 1: + moments sharded over dp; 2: + gradients; 3: + parameters
  int dp = 0;                  // data-parallel replicas the launch must give (0: world / (tp x pp))
  int tp = 1;                  // tensor-parallel ranks (the launch's ranks are dp x tp, tp innermost)
  bool sequence_parallel = false;  // norms and residuals split over the tp ranks too
  int pp = 1;                  // pipeline stages over ranks (the launch's ranks are pp x dp x tp)
  PipelineSchedule pp_schedule = PipelineSchedule::OneFOneB;  // its micro-batches are grad_accum's
  int pp_chunks = 1;           // model chunks per pipeline rank (v; > 1 only for interleaved)
  std::vector<int64_t> pp_layers;  // layers of each of pp x pp_chunks stages (empty: even split)
  // DualPipeV's forward/backward pairs overlapped ("on"), in sequence ("off"), or "auto": on
  // a GPU only, where the two run on their own streams (the CPU gains nothing from it).
  std::string pp_overlap = "auto";
  int cp = 1;                  // context-parallel ranks: each holds 2 of 2 x cp chunks of every sequence
  CpComm cp_comm = CpComm::P2P;  // how attention reaches the other chunks: ring, all-gather, all-to-all
  int ep = 1;                  // expert-parallel ranks, carved out of dp: each holds n_experts / ep experts
  bool print_schedule = false;     // `loom train --print-schedule`: draw the last step's pipeline

  int64_t eval_every = 0;      // 0: only at the end
  int64_t eval_batches = 10;

  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t checkpoint_every = 0;
  int64_t keep_last = 2;
  bool resume = true;          // continue from checkpoint_dir's latest checkpoint if any
  // Saves snapshot the state into host memory and a background thread writes it while training
  // goes on (async_checkpoint.hpp); false writes on the training thread.
  bool checkpoint_async = true;
  // How long a save (or the end of the run) waits for the previous background write.
  double commit_timeout_s = 600.0;
  // train.init_from: a Hugging Face model directory (config.json + model.safetensors or a
  // sharded index) whose weights start the run, on any layout; a resumed checkpoint wins.
  std::string init_from;

  BadStepConfig bad_steps;     // [bad_steps]: skip, loss_spike_factor, median_window, rollback_after, max_rollbacks
  FaultInjection inject;       // [debug]: inject_nan_at_steps, inject_loss_spike_at_steps, inject_loss_spike_scale

  std::string run_dir = "runs/default";  // metrics.jsonl and loss.svg
  int64_t log_every = 1;
  double straggler_fraction = 0.2;  // name the slowest rank when its compute lags the median by more; 0: off
  bool log_all_ranks = false;  // ranks > 0 also write run_dir/metrics.rank<r>.jsonl (their own memory, comm)
  std::string trace_path;      // Chrome/Perfetto trace per rank ("" = off); ".rankN" added under dp

  std::string sample_prompt;   // generated from at the end (needs tokenizer_dir)
  int64_t sample_tokens = 0;
  int64_t sample_count = 3;
  double sample_temperature = 0.8;
  int64_t sample_top_k = 40;

  int64_t tokens_per_step() const { return batch_size * seq_len * grad_accum; }
  // The [parallel] table (with train.batch_size and model.recompute) as the layout `loom plan`
  // prints; dp 0 (set by the launch) reads as ep, the smallest data parallelism ep can shard.
  ParallelLayout layout() const;
};

// Reads every key (unknown keys are an error) and validates ranges and consistency. The
// [parallel] table's layout key takes a layout as `loom plan` prints it ("tp=2 pp=2 dp=1 zero=1
// mbs=4 recompute=selective sp 1f1b"); it sets parallel.tp, pp, pp_chunks (v), dp, zero_stage,
// sequence_parallel, pp_schedule, train.batch_size (mbs) and model.recompute, and an explicit
// key that says otherwise is an error. The layout is checked by check_layout at
// LayoutRules::Engine: what the engine does not run yet is refused with the planner's message.
TrainConfig parse_train_config(ConfigReader& reader);
// The [model] section: a preset, then explicit dimensions override it.
ModelConfig parse_model_config(ConfigReader& reader);
// What the engine cannot train on CUDA (a head_dim above the CUDA attention kernel's): a
// loom::Error naming the key, its value and what to set instead.
// parse_train_config calls it when train.device is cuda; the trainer calls it again before it
// touches a device, since a caller may hand it any config.
void check_cuda_training(const TrainConfig& config);
// That this loom was built with CUDA and this process sees a device: a loom::Error saying which
// is missing and what to do. The CLI calls it before starting MPI, the trainer before building.
void check_cuda_available();

// The lm-head's vocabulary chunk the trainer uses: train.vocab_chunk when set (> 0); otherwise
// kDefaultVocabChunk on the CPU (whose logits buffer stays small and in cache), and on CUDA the
// whole vocabulary, so the backward never recomputes the logits (a second lm-head forward: 2 N
// V d FLOPs, about 10% of GPT-2 124M's step), when one micro-batch's logits and their gradient
// (4 + 2 bytes each in bf16, 4 in f32) take at most 1/16 of the device's memory; past that the
// largest multiple of 1024 that fits, and never below kDefaultVocabChunk.
int64_t resolved_vocab_chunk(const TrainConfig& config, int64_t device_memory_bytes);

}  // namespace loom
