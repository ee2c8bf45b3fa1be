#pragma once
// Training checkpoints. Layout under a root directory:
//   <root>/step_00001000/model.safetensors      HF names and layout (export_hf_weights), F32
//                        config.json            HF config (hf_config_json)
//                        optimizer.safetensors  caller-named tensors, e.g. "<param>.exp_avg"
//                        trainer_state.json     caller's JSON object (step, data position, ...)
//                        manifest.json          byte size and CRC32 of each file above
//   <root>/latest                               text: the newest checkpoint's directory name
// A checkpoint is built in `step_<N>.tmp-<pid>/` and renamed into place only when complete,
// and `latest` moves after that, so a crash or error mid-save never damages an existing
// checkpoint. Loading verifies every file against the manifest before parsing it.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/ckpt/safetensors.hpp"
#include "loom/ckpt/safetensors_writer.hpp"
#include "loom/model/config.hpp"

namespace loom {

struct CheckpointPayload {
  ModelConfig config;
  std::vector<SafetensorsEntry> model_weights;
  std::vector<SafetensorsEntry> optimizer_state;
  nlohmann::json trainer_state = nlohmann::json::object();
};

// Called with a file's name after it is written into a checkpoint's temp directory and before
// the checkpoint is complete: where fault injection (debug.kill_in_checkpoint_write) strikes.
using AfterFileHook = std::function<void(const std::string& file)>;

// Writes step `step` under `root` (created if missing) and returns the checkpoint directory.
// Re-saving an existing step replaces it. keep_last > 0 then removes all but the newest
// keep_last checkpoints by step number, never the one just written.
std::string save_checkpoint(const std::string& root, int64_t step, const CheckpointPayload& payload,
                            int keep_last = 0, const AfterFileHook& after_file = {});

// The same checkpoint, byte for byte, written straight from the tensors' memory (HF layout
// for the weights, as export_hf_weights gives them): no copy in user space. What the
// asynchronous saver writes from its host snapshot.
struct CheckpointSpans {
  ModelConfig config;
  std::vector<TensorSpans> model_weights;
  std::vector<TensorSpans> optimizer_state;
  nlohmann::json trainer_state = nlohmann::json::object();
};
std::string save_checkpoint_spans(const std::string& root, int64_t step,
                                  const CheckpointSpans& spans, int keep_last = 0,
                                  const AfterFileHook& after_file = {});

// Accepts a checkpoint directory or a root (resolved with latest_checkpoint). Throws
// loom::Error naming the file for a missing, truncated or corrupt file.
CheckpointPayload load_checkpoint(const std::string& dir_or_root);

// The directory `latest` names; if it names a directory that is gone, the highest complete
// step_<N> directory. nullopt when the root holds no checkpoint. In-progress `*.tmp-*`
// directories are never returned.
std::optional<std::string> latest_checkpoint(const std::string& root);

// "step_00001000": at least 8 digits, so names sort by step for the usual step counts.
std::string checkpoint_dir_name(int64_t step);

}  // namespace loom
