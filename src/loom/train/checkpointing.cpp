#include "loom/train/checkpointing.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/dist/tensor_comm.hpp"
#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/ckpt/hf_weights.hpp"
#include "loom/core/error.hpp"
#include "loom/model/tensor_shard.hpp"
#include "loom/obs/metrics_log.hpp"

namespace loom {

CheckpointPayload make_checkpoint_payload(const Transformer& model, const NamedTensors& optimizer_state,
                                          const nlohmann::json& trainer_state) {
  CheckpointPayload payload;
  payload.config = model.config();
  payload.model_weights = export_hf_weights(model.parameters(), DType::F32);
  for (const auto& [name, tensor] : optimizer_state)
    payload.optimizer_state.push_back(entry_from_tensor(name, tensor));
  payload.trainer_state = trainer_state;
  return payload;
}

NamedTensors optimizer_state_tensors(const std::vector<OwnedSlice>& owned) {
  NamedTensors out;
  auto add = [&](const OwnedSlice& slice, const char* suffix, const Tensor& data) {
    Tensor t = Tensor::empty(slice.shape, DType::F32, MemCategory::Workspace);
    t.copy_from(data);  // from any device
    out.emplace_back(slice.param->name + suffix, std::move(t));
  };
  for (const OwnedSlice& slice : owned) {
    if (slice.start != 0 || slice.count != shape_numel(slice.shape))
      throw_error("the single-file checkpoint holds whole tensors; '", slice.param->name, "' is owned from element ",
                  slice.start, " (", slice.count, " of ", shape_numel(slice.shape), "): use the sharded format");
    add(slice, ".exp_avg", slice.exp_avg);
    add(slice, ".exp_avg_sq", slice.exp_avg_sq);
    if (slice.master.defined()) add(slice, ".master", slice.master);
  }
  return out;
}

void require_same_model(const ModelConfig& expected, const ModelConfig& found, const std::string& source) {
  auto check = [&](const char* field, auto want, auto got) {
    if (want != got)
      throw_error(source, ": model.", field, " is ", got, " in the checkpoint but ", want,
                  " in the configuration (vocabulary or shape mismatch)");
  };
  check("arch", std::string(architecture_name(expected.arch)), std::string(architecture_name(found.arch)));
  check("vocab_size", expected.vocab_size, found.vocab_size);
  check("n_layer", expected.n_layer, found.n_layer);
  check("n_embd", expected.n_embd, found.n_embd);
  check("n_head", expected.n_head, found.n_head);
  check("n_kv_head", expected.n_kv_head, found.n_kv_head);
  check("head_dim", expected.head_dim(), found.head_dim());
  check("sliding_window", expected.sliding_window, found.sliding_window);
  check("global_attention_every", expected.global_attention_every, found.global_attention_every);
  check("ffn_hidden", expected.ffn_hidden, found.ffn_hidden);
  check("max_seq_len", expected.max_seq_len, found.max_seq_len);
  check("tied_embeddings", expected.tied_embeddings, found.tied_embeddings);
  check("norm_eps", expected.norm_eps, found.norm_eps);
  if (expected.arch == Architecture::Llama) {
    check("rope_theta", expected.rope_theta, found.rope_theta);
    check("rope_scaling_factor", expected.rope_scaling_factor, found.rope_scaling_factor);
    if (expected.rope_scaling_factor != 0) {
      check("rope_low_freq_factor", expected.rope_low_freq_factor, found.rope_low_freq_factor);
      check("rope_high_freq_factor", expected.rope_high_freq_factor, found.rope_high_freq_factor);
      check("rope_original_max_positions", expected.rope_original_max_positions, found.rope_original_max_positions);
    }
  }
}

namespace {

TensorLayout layout_of(const OwnedSlice& slice, const char* suffix) {
  return {slice.param->name + suffix, slice.shape, *suffix == '\0' && slice.param->hf_transposed};
}

// The small facts ranks must agree on travel as the bits of a float: all_gather and broadcast
// only copy bytes.
float bits_as_float(int32_t value) {
  float f;
  std::memcpy(&f, &value, sizeof f);
  return f;
}
int32_t float_as_bits(float f) {
  int32_t value;
  std::memcpy(&value, &f, sizeof value);
  return value;
}

// Rank 0 decides whether a phase succeeded; every rank learns it, so none waits forever on a
// rank that has given up. Returns rank 0's verdict.
bool agree_on_rank0(ProcessGroup& group, bool ok) {
  float flag = ok ? 1.0f : 0.0f;
  comm::broadcast(group, &flag, 1, 0)->wait();
  return flag != 0.0f;
}

}  // namespace

std::filesystem::path begin_sharded_save(ProcessGroup& group, const std::string& root,
                                         int64_t step) {
  const std::string context =
      "cannot save sharded checkpoint step " + std::to_string(step) + " under '" + root + "'";
  // Rank 0 makes the shared temp directory; its pid names it for everyone.
  std::string error;
  float token = bits_as_float(static_cast<int32_t>(::getpid()));
  if (group.rank() == 0) {
    try {
      (void)ckpt_files::create_temp_dir(root, step, std::to_string(float_as_bits(token)), context);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  comm::broadcast(group, &token, 1, 0)->wait();
  if (!agree_on_rank0(group, error.empty()))
    throw_error(group.rank() == 0 ? error
                                  : context + ": rank 0 could not create the checkpoint directory");
  return ckpt_files::fs::path(root) / (checkpoint_dir_name(step) + ckpt_files::kTempMarker +
                                       std::to_string(float_as_bits(token)));
}

std::vector<ShardSlice> shard_slices(const std::vector<OwnedSlice>& owned,
                                     const std::function<const float*(const Tensor&)>& host_f32) {
  std::vector<ShardSlice> slices;
  for (const OwnedSlice& s : owned) {
    const std::string& name = s.param->name;
    slices.push_back({name, s.shape, s.start, s.count, host_f32(s.value)});
    slices.push_back({name + ".exp_avg", s.shape, s.start, s.count, host_f32(s.exp_avg)});
    slices.push_back({name + ".exp_avg_sq", s.shape, s.start, s.count, host_f32(s.exp_avg_sq)});
    if (s.master.defined()) slices.push_back({name + ".master", s.shape, s.start, s.count, host_f32(s.master)});
  }
  return slices;
}

std::string commit_sharded_save(ProcessGroup& group, const std::filesystem::path& temp_dir,
                                const std::string& root, int64_t step, const ModelConfig& config,
                                const nlohmann::json& trainer_state, int keep_last,
                                const std::string& write_error) {
  const std::string context =
      "cannot save sharded checkpoint step " + std::to_string(step) + " under '" + root + "'";
  std::string error = write_error;
  float failed = error.empty() ? 0.0f : 1.0f;
  comm::all_reduce(group, &failed, 1, ReduceOp::Max)->wait();
  if (failed == 0.0f && group.rank() == 0) {
    try {
      (void)finish_sharded_checkpoint(temp_dir, root, step, group.size(), config, trainer_state,
                                      keep_last);
    } catch (const Error& e) {
      error = e.what();
    }
  } else if (group.rank() == 0) {
    std::error_code ignored;
    ckpt_files::fs::remove_all(temp_dir, ignored);
  }
  if (!agree_on_rank0(group, failed == 0.0f && error.empty()))
    throw_error(context, ": ", error.empty() ? "another rank failed (its own error says why)" : error);
  return (ckpt_files::fs::path(root) / checkpoint_dir_name(step)).string();
}

std::string save_sharded_checkpoint(ProcessGroup& group, const std::string& root, int64_t step,
                                    const ModelConfig& config, const nlohmann::json& trainer_state,
                                    const std::vector<OwnedSlice>& owned, int keep_last,
                                    const AfterFileHook& after_file) {
  const ckpt_files::fs::path temp_dir = begin_sharded_save(group, root, step);
  std::vector<Tensor> staged;  // host f32 copies of state on a device or in bf16
  auto host_f32 = [&](const Tensor& t) -> const float* {
    if (t.device() == Device::CPU && t.dtype() == DType::F32) return t.f32();
    staged.push_back(Tensor::empty(t.shape(), DType::F32, MemCategory::Workspace));
    staged.back().copy_from(t);
    return staged.back().f32();
  };
  std::string error;
  try {
    write_checkpoint_shard(temp_dir, group.rank(), group.size(), shard_slices(owned, host_f32),
                           after_file);
  } catch (const Error& e) {
    error = e.what();
  }
  return commit_sharded_save(group, temp_dir, root, step, config, trainer_state, keep_last, error);
}

std::vector<OwnedSlice> in_whole_tensor_coordinates(const std::vector<OwnedSlice>& owned, bool keep_replicated) {
  std::vector<OwnedSlice> out;
  for (const OwnedSlice& s : owned) {
    const Placement& placement = s.param->placement;
    if (placement.replicated) {
      if (keep_replicated) out.push_back(s);
      continue;
    }
    // The slice covers shard elements [s.start, s.start + s.count); keep each run's overlap.
    auto at = [](const Tensor& base, int64_t offset, int64_t count) {
      return base.defined() ? base.slice_as(offset, {count}) : Tensor();
    };
    for (const ShardRun& run : shard_runs(placement)) {
      const int64_t lo = std::max(s.start, run.shard_offset);
      const int64_t hi = std::min(s.start + s.count, run.shard_offset + run.count);
      if (lo >= hi) continue;
      const int64_t local = lo - s.start;
      out.push_back({s.param, placement.full_shape, run.full_offset + (lo - run.shard_offset), hi - lo,
                     at(s.value, local, hi - lo), at(s.exp_avg, local, hi - lo),
                     at(s.exp_avg_sq, local, hi - lo), at(s.master, local, hi - lo)});
    }
  }
  return out;
}

namespace {
// Elements [start, start + count) of a tensor, read as f32 on the host and copied to wherever
// `into` lives, in its dtype (straight into it when it is host f32).
void read_into(const CheckpointReader& reader, const TensorLayout& layout, int64_t start, int64_t count,
               const Tensor& into) {
  if (into.device() == Device::CPU && into.dtype() == DType::F32) {
    reader.read(layout, start, count, into.f32());
    return;
  }
  const Tensor host = Tensor::empty(into.shape(), DType::F32, MemCategory::Workspace);
  reader.read(layout, start, count, host.f32());
  into.copy_from(host);
}
}  // namespace

void load_owned_state(const CheckpointReader& reader, const std::vector<OwnedSlice>& owned) {
  for (const OwnedSlice& s : owned) {
    read_into(reader, layout_of(s, ""), s.start, s.count, s.value);
    read_into(reader, layout_of(s, ".exp_avg"), s.start, s.count, s.exp_avg);
    read_into(reader, layout_of(s, ".exp_avg_sq"), s.start, s.count, s.exp_avg_sq);
    if (s.master.defined()) read_into(reader, layout_of(s, ".master"), s.start, s.count, s.master);
  }
}

void load_owned_weights(const CheckpointReader& reader, const std::vector<OwnedSlice>& owned) {
  for (const OwnedSlice& s : owned) {
    read_into(reader, layout_of(s, ""), s.start, s.count, s.value);
    if (s.master.defined()) read_into(reader, layout_of(s, ""), s.start, s.count, s.master);
  }
}

nlohmann::json restore_weights(const std::string& dir_or_root, Transformer& model) {
  const CheckpointReader reader(dir_or_root);
  require_same_model(model.config(), reader.config(), reader.dir());
  for (Parameter* p : model.parameters())
    read_into(reader, {p->name, p->value.shape(), p->hf_transposed}, 0, p->value.numel(), p->value);
  return reader.trainer_state();
}

void export_hf_checkpoint(const std::string& dir_or_root, const std::string& out_dir, DType dtype) {
  Transformer model(checkpoint_model_config(dir_or_root));
  restore_weights(dir_or_root, model);
  std::filesystem::create_directories(out_dir);
  // transformers refuses safetensors files whose metadata lacks a known "format".
  write_safetensors(out_dir + "/model.safetensors", export_hf_weights(model.parameters(), dtype), {{"format", "pt"}});
  atomic_write_file(out_dir + "/config.json", hf_config_json(model.config()).dump(2) + "\n");
}

ModelConfig checkpoint_model_config(const std::string& dir_or_root) {
  std::string dir = dir_or_root;
  if (auto latest = latest_checkpoint(dir_or_root)) dir = *latest;
  std::ifstream in(dir + "/config.json");
  if (!in) throw_error("checkpoint ", dir, ": config.json is missing");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const std::exception& e) {
    throw_error("checkpoint ", dir, "/config.json: ", e.what());
  }
  return model_config_from_hf_json(json);
}

void drop_metrics_after(const std::string& metrics_path, int64_t step) {
  if (!std::filesystem::exists(metrics_path)) return;
  std::string kept;
  for (const nlohmann::json& record : MetricsLog::read_all(metrics_path))
    if (record.value("step", int64_t{0}) <= step) kept += record.dump() + "\n";
  atomic_write_file(metrics_path, kept);
}

void require_resumable(const CheckpointReader& reader, const ModelConfig& model, int64_t tokens_per_step,
                       const std::string& precision) {
  require_same_model(model, reader.config(), reader.dir());
  const nlohmann::json& state = reader.trainer_state();
  if (state.value("tokens_per_step", int64_t{0}) != tokens_per_step)
    throw_error("checkpoint ", reader.dir(), " was written with ", state.value("tokens_per_step", int64_t{0}),
                " tokens per step, this run uses ", tokens_per_step,
                ": change train.batch_size/seq_len/grad_accum back or start a fresh checkpoint.dir");
  if (state.value("precision", std::string("f32")) != precision)
    throw_error("checkpoint ", reader.dir(), " was trained with precision ", state.value("precision", std::string("f32")),
                ", this run asks for ", precision, ": set train.precision back or start a fresh checkpoint.dir");
}

}  // namespace loom
