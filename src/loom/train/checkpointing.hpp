#pragma once
// Glue between a training run and ckpt/: what goes into a checkpoint (weights, AdamW moments,
// fp32 masters, trainer state), how every rank saves its own shard of it, and how a run on
// any layout restores from a checkpoint of any layout.
//
// State names: a parameter's value is stored under its HF name, its moments and master under
// "<name>.exp_avg", "<name>.exp_avg_sq" and "<name>.master" (what AdamW::state_tensors uses).
// OwnedSlice and the Optimizer interface: optim/optimizer.hpp.
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/model/transformer.hpp"
#include "loom/optim/adamw.hpp"

namespace loom {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Single-file format: `optimizer_state` holds full tensors named as AdamW::state_tensors names them.
CheckpointPayload make_checkpoint_payload(const Transformer& model, const NamedTensors& optimizer_state,
                                          const nlohmann::json& trainer_state);
// Those tensors from what one process owns (Optimizer::owned_slices, every slice a whole
// parameter): "<name>.exp_avg", "<name>.exp_avg_sq" (+ ".master") per parameter, copied.
NamedTensors optimizer_state_tensors(const std::vector<OwnedSlice>& owned);

// Owned slices of tensor-parallel shards restated in the coordinates of the whole tensors:
// each slice of a shard's elements becomes the runs of whole-tensor elements it holds
// (model/tensor_shard.hpp), so a checkpoint names whole tensors only and loads at any tp.
// Slices of replicated parameters pass through unchanged, or are dropped without
// `keep_replicated`: every tp rank holds them, and one of them writes them.
std::vector<OwnedSlice> in_whole_tensor_coordinates(const std::vector<OwnedSlice>& owned,
                                                    bool keep_replicated = true);

// Sharded format, collective over `group`: every rank writes the state it owns, rank 0 the
// index, config and trainer state; returns the checkpoint directory on every rank. A failure
// on any rank leaves no checkpoint behind and throws on every rank. It is the three steps
// below run back to back; the asynchronous saver (async_checkpoint.hpp) runs the shard write
// on a background thread between them.
std::string save_sharded_checkpoint(ProcessGroup& group, const std::string& root, int64_t step,
                                    const ModelConfig& config, const nlohmann::json& trainer_state,
                                    const std::vector<OwnedSlice>& owned, int keep_last,
                                    const AfterFileHook& after_file = {});

// 1. Collective: rank 0 creates the shared "step_<N>.tmp-<token>" directory and every rank
//    learns its path; throws on every rank when rank 0 cannot.
std::filesystem::path begin_sharded_save(ProcessGroup& group, const std::string& root,
                                         int64_t step);
// 2. Each rank alone: write_checkpoint_shard(temp_dir, rank, world, shard_slices(...)). The
//    slices of `owned` (value, moments, master), their data from `host_f32`, which returns a
//    host f32 copy (or the tensor itself when it already is one).
std::vector<ShardSlice> shard_slices(const std::vector<OwnedSlice>& owned,
                                     const std::function<const float*(const Tensor&)>& host_f32);
// 3. Collective: every rank says whether its write failed (`error`, empty when it did not);
//    rank 0 then checks every rank's done marker, writes the index and manifest and installs
//    the directory (`latest` moves by rename). Returns the directory; throws on every rank when
//    any rank failed, and the temp directory is removed.
std::string commit_sharded_save(ProcessGroup& group, const std::filesystem::path& temp_dir,
                                const std::string& root, int64_t step, const ModelConfig& config,
                                const nlohmann::json& trainer_state, int keep_last,
                                const std::string& error);

// Fills every owned slice from `reader`: values and moments always, masters where the slice
// has one (a checkpoint without masters then is an error naming the tensor).
void load_owned_state(const CheckpointReader& reader, const std::vector<OwnedSlice>& owned);

// Fills every owned slice's values (and fp32 masters) from `reader`'s weights; moments untouched.
// For a run that starts from a pretrained model (train.init_from).
void load_owned_weights(const CheckpointReader& reader, const std::vector<OwnedSlice>& owned);

// Loads only the weights into a model with full parameters (sampling, export), from either
// format and any layout; returns the trainer state.
nlohmann::json restore_weights(const std::string& dir_or_root, Transformer& model);

// Writes `out_dir`/model.safetensors (HF names and layout, F32 or BF16) and config.json from a
// checkpoint of either format and any layout: what `transformers` loads directly.
void export_hf_checkpoint(const std::string& dir_or_root, const std::string& out_dir, DType dtype);

// Builds nothing: reads only the model config of a checkpoint.
ModelConfig checkpoint_model_config(const std::string& dir_or_root);

void require_same_model(const ModelConfig& expected, const ModelConfig& found, const std::string& source);

// A resumed run repeats the steps after its checkpoint: keeps only the metric records up to
// `step` (the file atomically rewritten; no file, nothing to do), so it holds each step once.
void drop_metrics_after(const std::string& metrics_path, int64_t step);

// Refuses to resume from `reader` a run of another model (require_same_model) or whose tokens
// per step or precision ("f32", "bf16") differ from the checkpoint's, naming what to set back.
void require_resumable(const CheckpointReader& reader, const ModelConfig& model, int64_t tokens_per_step,
                       const std::string& precision);

}  // namespace loom
