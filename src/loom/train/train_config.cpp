#include "loom/train/train_config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/pipeline_layout.hpp"
#include "loom/train/fp8_config.hpp"

namespace loom {

namespace {
void require_positive(const std::string& key, double value) {
  if (!(value > 0)) throw_error("config key '", key, "' has value ", value, ", expected > 0");
}
void require_range(const std::string& key, double value, double lo, double hi) {
  if (!(value >= lo && value <= hi))
    throw_error("config key '", key, "' has value ", value, ", expected a value in [", lo, ", ", hi, "]");
}
}  // namespace

ModelConfig parse_model_config(ConfigReader& r) {
  ModelConfig m;
  const std::string preset = r.get_string("model.preset", "");
  if (!preset.empty()) m = model_preset(preset);
  const std::string arch = r.get_string("model.arch", architecture_name(m.arch));
  if (arch == "gpt2") {
    m.arch = Architecture::GPT2;
  } else if (arch == "llama") {
    m.arch = Architecture::Llama;
  } else {
    throw_error("config key 'model.arch' has value '", arch, "', expected gpt2 or llama");
  }
  m.vocab_size = r.get_int("model.vocab_size", m.vocab_size);
  m.max_seq_len = r.get_int("model.max_seq_len", m.max_seq_len);
  m.n_layer = r.get_int("model.n_layer", m.n_layer);
  m.n_embd = r.get_int("model.n_embd", m.n_embd);
  m.n_head = r.get_int("model.n_head", m.n_head);
  m.n_kv_head = r.get_int("model.n_kv_head", r.has("model.n_head") && !r.has("model.n_kv_head") ? m.n_head : m.n_kv_head);
  m.attention_head_dim = r.get_int("model.head_dim", m.attention_head_dim);
  m.ffn_hidden = r.get_int("model.ffn_hidden", r.has("model.n_embd") && !r.has("model.ffn_hidden") && m.arch == Architecture::GPT2 ? 4 * m.n_embd : m.ffn_hidden);
  m.tied_embeddings = r.get_bool("model.tied_embeddings", m.tied_embeddings);
  m.norm_eps = r.get_double("model.norm_eps", m.norm_eps);
  m.rope_theta = r.get_double("model.rope_theta", m.rope_theta);
  m.rope_scaling_factor = r.get_double("model.rope_scaling_factor", m.rope_scaling_factor);
  m.rope_low_freq_factor = r.get_double("model.rope_low_freq_factor", m.rope_low_freq_factor);
  m.rope_high_freq_factor = r.get_double("model.rope_high_freq_factor", m.rope_high_freq_factor);
  m.rope_original_max_positions = r.get_int("model.rope_original_max_positions", m.rope_original_max_positions);
  m.n_experts = r.get_int("model.n_experts", m.n_experts);
  m.experts_per_token = r.get_int("model.experts_per_token", m.experts_per_token);
  m.n_shared_experts = r.get_int("model.n_shared_experts", m.n_shared_experts);
  m.moe_router = parse_moe_router(r.get_string("model.moe_router", moe_router_name(m.moe_router)));
  m.moe_aux_loss_coef = r.get_double("model.moe_aux_loss_coef", m.moe_aux_loss_coef);
  m.moe_z_loss_coef = r.get_double("model.moe_z_loss_coef", m.moe_z_loss_coef);
  m.moe_capacity_factor = r.get_double("model.moe_capacity_factor", m.moe_capacity_factor);
  m.moe_bias_rate = r.get_double("model.moe_bias_rate", m.moe_bias_rate);
  m.moe_ffn_hidden = r.get_int("model.moe_ffn_hidden", m.moe_ffn_hidden);
  m.moe_first_dense = r.get_int("model.moe_first_dense", m.moe_first_dense);
  m.moe_every = r.get_int("model.moe_every", m.moe_every);
  m.sliding_window = r.get_int("model.sliding_window", m.sliding_window);
  m.global_attention_every = r.get_int("model.global_attention_every", m.global_attention_every);
  // Multi-token prediction depths: planned (`loom plan`), refused by the trainer.
  m.mtp_layers = r.get_int("model.mtp_layers", m.mtp_layers);
  m.validate();
  // The same model however it is spelt, as the HF config reads back (a checkpoint's model must
  // compare equal): a window at least as long as the context is none, a "global" period longer
  // than the model leaves every layer windowed.
  if (m.sliding_window >= m.max_seq_len) m.sliding_window = m.global_attention_every = 0;
  if (m.global_attention_every > m.n_layer) m.global_attention_every = 0;
  return m;
}

namespace {

// Where each key of a layout lives in the config.
const char* config_key_of(const std::string& layout_key) {
  static const std::pair<const char*, const char*> keys[] = {
      {"tp", "parallel.tp"},         {"pp", "parallel.pp"},           {"v", "parallel.pp_chunks"},
      {"dp", "parallel.dp"},         {"cp", "parallel.cp"},           {"cp_comm", "parallel.cp_comm"},
      {"ep", "parallel.ep"},         {"zero", "parallel.zero_stage"},
      {"mbs", "train.batch_size"},
      {"recompute", "model.recompute"}, {"sp", "parallel.sequence_parallel"}, {"schedule", "parallel.pp_schedule"}};
  for (const auto& [layout, config] : keys)
    if (layout_key == layout) return config;
  return "";
}

std::string layout_value(const ParallelLayout& l, const std::string& key) {
  if (key == "tp") return std::to_string(l.tp);
  if (key == "pp") return std::to_string(l.pp);
  if (key == "v") return std::to_string(l.vp);
  if (key == "dp") return std::to_string(l.dp);
  if (key == "cp") return std::to_string(l.cp);
  if (key == "cp_comm") return cp_comm_name(l.cp_comm);
  if (key == "ep") return std::to_string(l.ep);
  if (key == "zero") return std::to_string(l.zero_stage);
  if (key == "mbs") return std::to_string(l.micro_batch);
  if (key == "recompute") return recompute_name(l.recompute);
  if (key == "sp") return l.sequence_parallel ? "true" : "false";
  if (key == "schedule") return schedule_name(l.schedule);
  return "";
}

void copy_layout_key(ParallelLayout& to, const ParallelLayout& from, const std::string& key) {
  if (key == "tp") to.tp = from.tp;
  else if (key == "pp") to.pp = from.pp;
  else if (key == "v") to.vp = from.vp;
  else if (key == "dp") to.dp = from.dp;
  else if (key == "cp") to.cp = from.cp;
  else if (key == "cp_comm") to.cp_comm = from.cp_comm;
  else if (key == "ep") to.ep = from.ep;
  else if (key == "zero") to.zero_stage = from.zero_stage;
  else if (key == "mbs") to.micro_batch = from.micro_batch;
  else if (key == "recompute") to.recompute = from.recompute;
  else if (key == "sp") to.sequence_parallel = from.sequence_parallel;
  else if (key == "schedule") to.schedule = from.schedule;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

// The [parallel] table's layout key over the explicit keys: it sets what its text names, and
// an explicit key that says otherwise is an error. Returns the keys the text set.
std::vector<std::string> apply_layout_key(ConfigReader& r, TrainConfig& c, ParallelLayout& layout) {
  if (!r.has("parallel.layout")) return {};
  const std::string text = r.get_string("parallel.layout", "");
  std::vector<std::string> given;
  ParallelLayout from_text;
  try {
    from_text = parse_layout(text, &given);
  } catch (const Error& e) {
    throw_error("config key 'parallel.layout' has value '", text, "': ", e.what());
  }
  // A pasted v > 1 without a schedule means interleaved, unless pp_schedule says otherwise.
  if (contains(given, "v") && !contains(given, "schedule") && !r.has("parallel.pp_schedule"))
    given.push_back("schedule");
  const ParallelLayout explicit_keys = layout;
  for (const std::string& key : given) {
    const std::string config_key = config_key_of(key);
    if (!config_key.empty() && r.has(config_key) && layout_value(from_text, key) != layout_value(explicit_keys, key))
      throw_error("config key 'parallel.layout' sets ", key, " = ", layout_value(from_text, key), " but config key '",
                  config_key, "' is ", layout_value(explicit_keys, key), ": give one of them, or make them agree");
    copy_layout_key(layout, from_text, key);
  }
  c.tp = static_cast<int>(layout.tp);
  c.pp = static_cast<int>(layout.pp);
  c.pp_chunks = static_cast<int>(layout.vp);
  c.cp = static_cast<int>(layout.cp);
  c.cp_comm = layout.cp_comm;
  c.ep = static_cast<int>(layout.ep);
  if (contains(given, "dp")) c.dp = static_cast<int>(layout.dp);
  c.zero_stage = layout.zero_stage;
  c.batch_size = layout.micro_batch;
  c.recompute = layout.recompute;
  c.sequence_parallel = layout.sequence_parallel;
  c.pp_schedule = layout.schedule;
  return given;
}

// The layout's rules, shared with the planner (parallel/parallel_layout), at the engine's
// level: the first problem, named by the config key that set it.
void check_parallel_layout(const TrainConfig& c, const ParallelLayout& l, const std::vector<std::string>& from_text) {
  for (const LayoutProblem& p : layout_problems(l, c.model, c.seq_len)) {
    if (p.key == "model") throw_error(p.message);
    const std::string config_key = config_key_of(p.key);
    if (contains(from_text, p.key) || config_key.empty())
      throw_error("config key 'parallel.layout' sets ", p.key, " = ", layout_value(l, p.key), ": ", p.message);
    const bool renamed = config_key != "parallel." + p.key;
    throw_error("config key '", config_key, "'", renamed ? " (layout " + p.key + ")" : "", " has value ",
                layout_value(l, p.key), ": ", p.message);
  }
}

// What the layout does not say: sequence parallelism splits each micro-batch's rows, and the
// pipeline's stages and micro-batches.
void check_sequence_parallel_rows(const TrainConfig& c) {
  const int64_t rows = c.batch_size * c.seq_len / c.cp;  // a cp rank's share of a micro-batch
  if (c.sequence_parallel && rows % c.tp != 0)
    throw_error("config key 'parallel.sequence_parallel' needs train.batch_size x train.seq_len",
                c.cp > 1 ? " / parallel.cp" : "", " = ", rows, " rows to divide by parallel.tp = ", c.tp,
                "; change the batch size or sequence length");
}

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  for (PipelineSchedule s : all_pipeline_schedules())
    if (name == schedule_name(s)) return s;
  throw_error("config key 'parallel.pp_schedule' has value '", name, "', expected afab, 1f1b, interleaved, zbh1, zbv or dualpipev");
}

// parallel.pp_overlap: auto, on or off, and on only where DualPipeV has pairs to overlap.
void check_pipeline_overlap(const TrainConfig& c) {
  if (c.pp_overlap != "auto" && c.pp_overlap != "on" && c.pp_overlap != "off")
    throw_error("config key 'parallel.pp_overlap' has value '", c.pp_overlap,
                "', expected auto, on or off");
  if (c.pp_overlap == "on" && (c.pp == 1 || c.pp_schedule != PipelineSchedule::DualPipeV))
    throw_error(
        "config key 'parallel.pp_overlap' has value 'on', but only DualPipeV pairs a forward "
        "with a backward to overlap, and this run has ",
        c.pp == 1 ? std::string("no pipeline (parallel.pp = 1)")
                  : "parallel.pp_schedule = '" + std::string(schedule_name(c.pp_schedule)) + "'",
        "; set pp_schedule = \"dualpipev\" with pp >= 2, or pp_overlap = \"auto\"");
}

// The schedule has the micro-batches it needs; pp_layers, when given, cuts the model into
// pp x pp_chunks stages.
void check_pipeline_micro_batches(const TrainConfig& c) {
  (void)stage_layer_counts(c.model.n_layer, int64_t{c.pp} * c.pp_chunks, c.pp_layers,
                           "parallel.pp_layers");
  if (c.pp == 1) return;
  const int64_t m = c.grad_accum;
  if (c.pp_schedule != PipelineSchedule::AllForwardAllBackward && m < c.pp)
    throw_error("config key 'train.grad_accum' has value ", m, ": ", schedule_name(c.pp_schedule), " over parallel.pp = ",
                c.pp, " stages needs at least ", c.pp, " micro-batches (grad_accum) to fill the pipeline; set "
                "grad_accum >= ", c.pp, " (or pp_schedule = \"afab\")");
  if (stage_placement(c.pp_schedule) == StagePlacement::V && m < 2 * c.pp)
    throw_error("config key 'train.grad_accum' has value ", m, ": ", schedule_name(c.pp_schedule),
                " over parallel.pp = ", c.pp,
                " ranks forwards 2 x pp - 1 = ", 2 * c.pp - 1, " micro-batches before its first backward, so it needs "
                "grad_accum >= 2 x pp = ", 2 * c.pp, " (or pp_schedule = \"zbh1\", which needs ", c.pp, ")");
  if (c.pp_schedule == PipelineSchedule::Interleaved && m % c.pp != 0)
    throw_error("config key 'train.grad_accum' has value ", m, ": the interleaved schedule sends micro-batches "
                "through each chunk in groups of parallel.pp = ", c.pp, "; use a multiple of ", c.pp);
}

// [bad_steps] and the faults [debug] injects: ranges, and what a rollback needs.
void check_bad_steps(const TrainConfig& c) {
  const BadStepConfig& b = c.bad_steps;
  if (b.loss_spike_factor != 0 && !(b.loss_spike_factor > 1 && std::isfinite(b.loss_spike_factor)))
    throw_error("config key 'bad_steps.loss_spike_factor' has value ", b.loss_spike_factor,
                ", expected a multiple of the median loss above 1 (e.g. 2.5), or 0 to turn spike detection off");
  require_range("bad_steps.median_window", static_cast<double>(b.median_window), 1, 1e6);
  require_range("bad_steps.rollback_after", static_cast<double>(b.rollback_after), 0, 1e9);
  require_range("bad_steps.max_rollbacks", static_cast<double>(b.max_rollbacks), 0, 1e9);
  if (!b.skip && (b.loss_spike_factor > 0 || b.rollback_after > 0))
    throw_error("config key 'bad_steps.skip' is false, but bad_steps.", b.loss_spike_factor > 0 ? "loss_spike_factor" : "rollback_after",
                " is set: spikes and rollbacks act on skipped steps; set bad_steps.skip = true or drop the key");
  if (b.rollback_after > 0 && c.checkpoint_dir.empty())
    throw_error("config key 'bad_steps.rollback_after' is ", b.rollback_after,
                ": a rollback returns to the last checkpoint, and checkpoint.dir is not set; set checkpoint.dir "
                "(and checkpoint.every), or bad_steps.rollback_after = 0");
  auto check_steps = [&](const std::vector<int64_t>& steps, const char* key) {
    for (int64_t s : steps)
      if (s < 1 || s > c.steps)
        throw_error("config key 'debug.", key, "' holds step ", s, ", expected steps in [1, train.steps = ", c.steps,
                    "] (1-based, as printed)");
  };
  check_steps(c.inject.nan_at_steps, "inject_nan_at_steps");
  check_steps(c.inject.loss_spike_at_steps, "inject_loss_spike_at_steps");
  if (c.inject.slow_rank < -1)
    throw_error("config key 'debug.slow_rank' has value ", c.inject.slow_rank, ", expected a world rank (or -1: none)");
  require_range("debug.slow_rank_ms", c.inject.slow_rank_ms, 0, 1e7);
  if (c.inject.kill_at_step != 0) check_steps({c.inject.kill_at_step}, "kill_at_step");
  if (c.inject.kill_rank < 0)
    throw_error("config key 'debug.kill_rank' has value ", c.inject.kill_rank, ", expected a world rank");
  require_range("debug.slow_checkpoint_write_ms", c.inject.slow_checkpoint_write_ms, 0, 1e7);
  if (const int64_t s = c.inject.kill_in_checkpoint_write; s != 0) {
    check_steps({s}, "kill_in_checkpoint_write");
    if (c.checkpoint_dir.empty())
      throw_error("config key 'debug.kill_in_checkpoint_write' is ", s,
                  ", but checkpoint.dir is not set: set checkpoint.dir (and checkpoint.every), or "
                  "drop the key");
    if (s != c.steps && (c.checkpoint_every == 0 || s % c.checkpoint_every != 0))
      throw_error(
          "config key 'debug.kill_in_checkpoint_write' is ", s,
          ", a step that saves no checkpoint: expected ",
          c.checkpoint_every > 0
              ? "a multiple of checkpoint.every = " + std::to_string(c.checkpoint_every) + " or "
              : std::string(),
          "train.steps = ", c.steps);
  }
  require_range("log.straggler_fraction", c.straggler_fraction, 0, 1e6);
  if (!(c.inject.loss_spike_scale > 0))
    throw_error("config key 'debug.inject_loss_spike_scale' has value ", c.inject.loss_spike_scale,
                ", expected > 0 (the injected loss is the step's loss times it)");
}
}  // namespace

ParallelLayout TrainConfig::layout() const {
  ParallelLayout l;
  l.tp = tp;
  l.pp = pp;
  l.vp = pp_chunks;
  l.cp = cp;
  l.cp_comm = cp_comm;
  l.ep = ep;
  l.dp = dp > 0 ? dp : ep;
  l.zero_stage = zero_stage;
  l.micro_batch = batch_size;
  l.recompute = recompute;
  l.sequence_parallel = sequence_parallel;
  l.schedule = pp_schedule;
  return l;
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::F32: return "f32";
    case Precision::BF16: return "bf16";
    case Precision::FP8: return "fp8";
  }
  return "?";
}

TrainConfig parse_train_config(ConfigReader& r) {
  TrainConfig c;
  c.model = parse_model_config(r);
  c.recompute = parse_recompute(r.get_string("model.recompute", "none"));

  c.train_data = r.get_string("data.train", "");
  const int64_t source_count = r.get_table_array("data.sources", {"path", "weight"});
  for (int64_t i = 0; i < source_count; ++i) {
    const std::string key = "data.sources[" + std::to_string(i) + "]";
    if (!r.has(key + ".path"))
      throw_error("config key '", key, ".path' is missing: every [[data.sources]] needs a glob of token shards");
    DataSource source{r.get_string(key + ".path", ""), r.get_double(key + ".weight", 1.0)};
    if (source.pattern.empty()) throw_error("config key '", key, ".path' is empty: expected a glob of token shards");
    if (!(source.weight > 0) || !std::isfinite(source.weight))
      throw_error("config key '", key, ".weight' has value ", source.weight, ", expected a positive number (the "
                  "source's share of the sequences is its weight over the sum of the weights)");
    c.train_sources.push_back(source);
  }
  c.val_data = r.get_string("data.val", "");
  c.tokenizer_dir = r.get_string("data.tokenizer_dir", "");
  c.shuffle = r.get_bool("data.shuffle", c.shuffle);
  c.document_mask = r.get_bool("data.document_mask", c.document_mask);
  c.eot_token = static_cast<int32_t>(r.get_int("data.eot_token", c.eot_token));
  c.document_positions = r.get_bool("data.document_positions", c.document_positions);
  c.split_long_documents = r.get_bool("data.split_long_documents", c.split_long_documents);

  c.batch_size = r.get_int("train.batch_size", c.batch_size);
  c.seq_len = r.get_int("train.seq_len", c.seq_len);
  c.grad_accum = r.get_int("train.grad_accum", c.grad_accum);
  c.steps = r.get_int("train.steps", c.steps);
  c.init_from = r.get_string("train.init_from", "");
  const int64_t seed = r.get_int("train.seed", static_cast<int64_t>(c.seed));
  if (seed < 0) throw_error("config key 'train.seed' has value ", seed, ", expected >= 0");
  c.seed = static_cast<uint64_t>(seed);
  const std::string precision = r.get_string("train.precision", "f32");
  if (precision == "f32") c.precision = Precision::F32;
  else if (precision == "bf16") c.precision = Precision::BF16;
  else if (precision == "fp8") c.precision = Precision::FP8;
  else throw_error("config key 'train.precision' has value '", precision, "', expected f32, bf16 or fp8");
  c.fp8 = parse_fp8_config(r, c.precision == Precision::FP8);
  c.threads = static_cast<int>(r.get_int("train.threads", c.threads));
  const std::string device = r.get_string("train.device", device_name(c.device));
  if (device == "cpu") c.device = Device::CPU;
  else if (device == "cuda") c.device = Device::CUDA;
  else throw_error("config key 'train.device' has value '", device, "', expected cpu or cuda");
  c.vocab_chunk = r.get_int("train.vocab_chunk", c.vocab_chunk);

  c.schedule.kind = parse_lr_schedule(r.get_string("optim.schedule", "cosine"));
  c.schedule.peak_lr = r.get_double("optim.lr", c.schedule.peak_lr);
  c.schedule.min_lr = r.get_double("optim.min_lr", c.schedule.peak_lr * 0.1);
  c.schedule.warmup_steps = r.get_int("optim.warmup_steps", c.schedule.warmup_steps);
  c.schedule.decay_fraction = r.get_double("optim.decay_fraction", c.schedule.decay_fraction);
  c.adamw.beta1 = r.get_double("optim.beta1", c.adamw.beta1);
  c.adamw.beta2 = r.get_double("optim.beta2", c.adamw.beta2);
  c.adamw.eps = r.get_double("optim.eps", c.adamw.eps);
  c.adamw.weight_decay = r.get_double("optim.weight_decay", c.adamw.weight_decay);
  c.grad_clip = r.get_double("optim.grad_clip", c.grad_clip);
  c.bucket_mb = r.get_double("parallel.bucket_mb", c.bucket_mb);
  const std::string backend = r.get_string("parallel.backend", "auto");
  if (backend == "auto") c.backend = CommBackend::Auto;
  else if (backend == "mpi") c.backend = CommBackend::Mpi;
  else if (backend == "nccl") c.backend = CommBackend::Nccl;
  else throw_error("config key 'parallel.backend' has value '", backend, "', expected auto, mpi or nccl");
  c.zero_stage = static_cast<int>(r.get_int("parallel.zero_stage", c.zero_stage));
  c.dp = static_cast<int>(r.get_int("parallel.dp", c.dp));
  c.tp = static_cast<int>(r.get_int("parallel.tp", c.tp));
  c.sequence_parallel = r.get_bool("parallel.sequence_parallel", c.sequence_parallel);
  c.pp = static_cast<int>(r.get_int("parallel.pp", c.pp));
  c.ep = static_cast<int>(r.get_int("parallel.ep", c.ep));
  c.pp_schedule = parse_pipeline_schedule(r.get_string("parallel.pp_schedule", schedule_name(c.pp_schedule)));
  c.pp_chunks = static_cast<int>(r.get_int("parallel.pp_chunks", c.pp_chunks));
  c.pp_layers = r.get_int_list("parallel.pp_layers", c.pp_layers);
  c.pp_overlap = r.get_string("parallel.pp_overlap", c.pp_overlap);
  c.cp = static_cast<int>(r.get_int("parallel.cp", c.cp));
  c.cp_comm = parse_cp_comm(r.get_string("parallel.cp_comm", cp_comm_name(c.cp_comm)));
  ParallelLayout layout = c.layout();
  const std::vector<std::string> layout_keys = apply_layout_key(r, c, layout);

  c.eval_every = r.get_int("eval.every", c.eval_every);
  c.eval_batches = r.get_int("eval.batches", c.eval_batches);

  c.checkpoint_dir = r.get_string("checkpoint.dir", "");
  c.checkpoint_every = r.get_int("checkpoint.every", c.checkpoint_every);
  c.keep_last = r.get_int("checkpoint.keep_last", c.keep_last);
  c.resume = r.get_bool("checkpoint.resume", c.resume);
  c.checkpoint_async = r.get_bool("checkpoint.async", c.checkpoint_async);
  c.commit_timeout_s = r.get_double("checkpoint.commit_timeout_s", c.commit_timeout_s);

  c.bad_steps.skip = r.get_bool("bad_steps.skip", c.bad_steps.skip);
  c.bad_steps.loss_spike_factor = r.get_double("bad_steps.loss_spike_factor", c.bad_steps.loss_spike_factor);
  c.bad_steps.median_window = r.get_int("bad_steps.median_window", c.bad_steps.median_window);
  c.bad_steps.rollback_after = r.get_int("bad_steps.rollback_after", c.bad_steps.rollback_after);
  c.bad_steps.max_rollbacks = r.get_int("bad_steps.max_rollbacks", c.bad_steps.max_rollbacks);
  c.inject.nan_at_steps = r.get_int_list("debug.inject_nan_at_steps", c.inject.nan_at_steps);
  c.inject.loss_spike_at_steps = r.get_int_list("debug.inject_loss_spike_at_steps", c.inject.loss_spike_at_steps);
  c.inject.loss_spike_scale = r.get_double("debug.inject_loss_spike_scale", c.inject.loss_spike_scale);
  c.inject.slow_rank = static_cast<int>(r.get_int("debug.slow_rank", c.inject.slow_rank));
  c.inject.slow_rank_ms = r.get_double("debug.slow_rank_ms", c.inject.slow_rank_ms);
  c.inject.kill_at_step = r.get_int("debug.kill_at_step", c.inject.kill_at_step);
  c.inject.kill_rank = static_cast<int>(r.get_int("debug.kill_rank", c.inject.kill_rank));
  c.inject.kill_in_checkpoint_write =
      r.get_int("debug.kill_in_checkpoint_write", c.inject.kill_in_checkpoint_write);
  c.inject.slow_checkpoint_write_ms =
      r.get_double("debug.slow_checkpoint_write_ms", c.inject.slow_checkpoint_write_ms);

  c.run_dir = r.get_string("log.dir", c.run_dir);
  c.log_every = r.get_int("log.every", c.log_every);
  c.trace_path = r.get_string("log.trace", "");
  c.log_all_ranks = r.get_bool("log.all_ranks", c.log_all_ranks);
  c.straggler_fraction = r.get_double("log.straggler_fraction", c.straggler_fraction);

  c.sample_prompt = r.get_string("sample.prompt", "");
  c.sample_tokens = r.get_int("sample.tokens", c.sample_tokens);
  c.sample_count = r.get_int("sample.count", c.sample_count);
  c.sample_temperature = r.get_double("sample.temperature", c.sample_temperature);
  c.sample_top_k = r.get_int("sample.top_k", c.sample_top_k);
  r.reject_unknown_keys();

  // Ranges and consistency.
  if (!c.train_data.empty() && !c.train_sources.empty())
    throw_error("config keys 'data.train' and [[data.sources]] are both set: give one glob as data.train, or "
                "every source (data.train's among them) as a [[data.sources]] table with its weight");
  if (c.train_data.empty() && c.train_sources.empty())
    throw_error("config key 'data.train' is missing: expected a glob of token shards (or [[data.sources]] "
                "tables with path and weight, to mix several)");
  if (c.train_sources.empty()) c.train_sources = {{c.train_data, 1.0}};
  require_positive("train.batch_size", static_cast<double>(c.batch_size));
  require_positive("train.seq_len", static_cast<double>(c.seq_len));
  if (c.seq_len > c.model.max_seq_len)
    throw_error("config key 'train.seq_len' has value ", c.seq_len, ", expected at most model.max_seq_len = ", c.model.max_seq_len);
  require_positive("train.grad_accum", static_cast<double>(c.grad_accum));
  require_positive("train.steps", static_cast<double>(c.steps));
  if (!c.init_from.empty() && !std::filesystem::is_directory(c.init_from))
    throw_error("config key 'train.init_from': '", c.init_from,
                "' is not a directory (expected a Hugging Face model directory: config.json and model.safetensors)");
  if (c.vocab_chunk < 0)
    throw_error("config key 'train.vocab_chunk' has value ", c.vocab_chunk,
                ", expected > 0, or 0 to choose it for the device");
  if (c.threads < 0) throw_error("config key 'train.threads' has value ", c.threads, ", expected >= 0 (0 = all cores)");
  require_positive("optim.lr", c.schedule.peak_lr);
  require_range("optim.min_lr", c.schedule.min_lr, 0.0, c.schedule.peak_lr);
  require_range("optim.warmup_steps", static_cast<double>(c.schedule.warmup_steps), 0, static_cast<double>(c.steps));
  require_range("optim.decay_fraction", c.schedule.decay_fraction, 0.0, 1.0);
  require_range("optim.beta1", c.adamw.beta1, 0.0, 0.999999);
  require_range("optim.beta2", c.adamw.beta2, 0.0, 0.999999);
  require_positive("optim.eps", c.adamw.eps);
  require_range("optim.weight_decay", c.adamw.weight_decay, 0.0, 1.0);
  require_range("optim.grad_clip", c.grad_clip, 0.0, 1e9);
  require_range("parallel.bucket_mb", c.bucket_mb, 1e-6, 1e6);
  if (c.dp < 0)
    throw_error("config key 'parallel.dp' has value ", c.dp, ", expected >= 1 (or 0: whatever the launch gives)");
  check_parallel_layout(c, layout, layout_keys);
  check_sequence_parallel_rows(c);
  check_pipeline_micro_batches(c);
  check_pipeline_overlap(c);
  require_range("eval.every", static_cast<double>(c.eval_every), 0, 1e18);
  require_positive("eval.batches", static_cast<double>(c.eval_batches));
  require_range("checkpoint.every", static_cast<double>(c.checkpoint_every), 0, 1e18);
  require_range("checkpoint.keep_last", static_cast<double>(c.keep_last), 0, 1e9);
  if (!(c.commit_timeout_s > 0 && c.commit_timeout_s <= 1e6))
    throw_error(
        "config key 'checkpoint.commit_timeout_s' has value ", c.commit_timeout_s,
        ", expected seconds in (0, 1e6] that a save may wait for the previous background write");
  require_positive("log.every", static_cast<double>(c.log_every));
  check_bad_steps(c);
  require_range("sample.tokens", static_cast<double>(c.sample_tokens), 0, 1e6);
  require_positive("sample.temperature", c.sample_temperature);
  require_positive("sample.count", static_cast<double>(c.sample_count));
  require_range("sample.top_k", static_cast<double>(c.sample_top_k), 0, 1e9);
  if (c.sample_tokens > 0 && c.sample_prompt.empty())
    throw_error("config key 'sample.prompt' is missing: sample.tokens > 0 needs a prompt to continue");
  if (c.sample_tokens > 0 && c.tokenizer_dir.empty())
    throw_error("config key 'data.tokenizer_dir' is missing: sample.tokens > 0 needs the tokenizer");
  if (c.backend == CommBackend::Nccl && c.device != Device::CUDA)
    throw_error("config key 'parallel.backend' is \"nccl\" with train.device = \"cpu\": NCCL carries GPU "
                "memory only; use \"mpi\" or \"auto\" on the CPU");
  if (c.document_positions && !c.document_mask)
    throw_error("config key 'data.document_positions' is true without data.document_mask: positions "
                "restart per document only when documents are masked; set data.document_mask = true");
  if (c.split_long_documents && !c.document_mask)
    throw_error("config key 'data.split_long_documents' is true without data.document_mask: only masked "
                "documents are checked against the sequence; set data.document_mask = true or drop the key");
  if (c.document_mask && (c.eot_token < 0 || c.eot_token >= c.model.vocab_size))
    throw_error("config key 'data.eot_token' is ", c.eot_token, ", outside model.vocab_size's [0, ",
                c.model.vocab_size, "): data.document_mask = true needs the end-of-document token id");
  check_fp8_training(c);
  if (c.device == Device::CUDA) check_cuda_training(c);
  c.schedule.total_steps = c.steps;
  return c;
}

int64_t resolved_vocab_chunk(const TrainConfig& c, int64_t device_memory_bytes) {
  if (c.vocab_chunk > 0) return c.vocab_chunk;
  const int64_t vocab = c.model.vocab_size;
  if (c.device != Device::CUDA) return std::min(kDefaultVocabChunk, vocab);
  // bf16 and FP8 keep bf16 logits and write their gradient over them (kernels/cuda/
  // cross_entropy.hpp; LOOM_CUDA_LOGITS=f32 takes 3 times this); tensor parallelism's shard
  // passes keep f32 logits and a bf16 gradient (6).
  const bool bf16 = c.precision != Precision::F32;
  const int64_t bytes_per_logit = bf16 ? (c.tp > 1 ? 6 : 2) : 4;
  const int64_t rows = std::max<int64_t>(1, c.batch_size * c.seq_len);
  const int64_t fits = device_memory_bytes / 16 / (rows * bytes_per_logit);
  if (fits >= vocab) return vocab;
  return std::min(vocab, std::max(kDefaultVocabChunk, fits / 1024 * 1024));
}

void check_cuda_available() {
  if (!device_memory::built_with(Device::CUDA))
    throw_error("train.device = \"cuda\" (--device cuda): this loom was built without CUDA (no nvcc at configure "
                "time, or -DLOOM_WITH_CUDA=OFF): rebuild where nvcc is found, or use --device cpu");
  if (device_memory::cuda_device_count() == 0)
    throw_error("train.device = \"cuda\" (--device cuda): no CUDA device is visible to this process; run on a "
                "machine with a GPU, or use --device cpu");
}

void check_cuda_training(const TrainConfig& c) {
  const int64_t max_head_dim = ops::max_attention_head_dim(Device::CUDA);
  if (max_head_dim > 0 && c.model.head_dim() > max_head_dim)
    throw_error(c.model.attention_head_dim > 0 ? "model.head_dim = "
                                               : "model.n_embd / model.n_head = head_dim ",
                c.model.head_dim(), ": the CUDA attention kernel takes head_dim up to ",
                max_head_dim, "; use narrower heads or train on the CPU");
}

}  // namespace loom
