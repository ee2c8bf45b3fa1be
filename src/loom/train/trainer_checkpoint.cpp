// Trainer's checkpoints: the state a resumed run needs beside the tensors, saving (sharded
// when ranks hold different pieces, else the single-file format), resuming and initialising
// from a Hugging Face model. The rest of Trainer is in trainer.cpp.
#include <chrono>
#include <filesystem>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/fp8_config.hpp"
#include "loom/train/launch.hpp"
#include "loom/train/trainer.hpp"

namespace loom {

// Under ZeRO or tensor, pipeline or expert parallelism every rank writes what it owns
// (collective), in whole-tensor coordinates; otherwise rank 0 writes the single-file format,
// whose model.safetensors Hugging Face loads as is.
bool Trainer::writes_sharded() const {
  return optimizer_->shards_state_over_data_parallel() || groups_.tp || groups_.pp || groups_.ep;
}

nlohmann::json Trainer::trainer_state(int64_t step) const {
  const LoaderState loader = train_loader_->state();
  nlohmann::json state = {{"step", step},
          {"optimizer_steps", optimizer_steps()},
          {"seed", config_.seed},
          {"tokens_seen", step * config_.tokens_per_step()},
          {"loader", loader_state_json(loader)},
          {"tokens_per_step", global_tokens_per_step()},
          {"precision", precision_name(config_.precision)},
          {"bad_steps", bad_steps_.state()}};
  // Delayed scaling's amax histories (every replica holds the same, reduced ones): a resumed run
  // scales its next step as the uninterrupted one would. JSON numbers carry a float exactly.
  if (fp8_) state["fp8_amax_history"] = fp8_amax_history();
  // The sigmoid router's selection biases are state, not parameters: every layer's, gathered
  // from the pipeline stages holding them (each layer lives on one pp rank; the rest add 0).
  if (config_.model.is_moe() && config_.model.moe_router == MoeRouter::Sigmoid) {
    std::vector<float> biases = model_->moe_biases();
    if (groups_.pp)
      comm::all_reduce(*groups_.pp, biases.data(), static_cast<int64_t>(biases.size()), ReduceOp::Sum)->wait();
    state["moe_bias"] = biases;
  }
  return state;
}

std::vector<float> Trainer::fp8_amax_history() const {
  if (!fp8_) return {};
  // Zeros at the layers of other stages and the experts of other ep ranks.
  std::vector<float> history = fp8_->amax_history();
  for (const auto& group : {groups_.pp, groups_.ep})
    if (group)
      comm::all_reduce(*group, history.data(), static_cast<int64_t>(history.size()), ReduceOp::Max)
          ->wait();
  return history;
}

int64_t Trainer::optimizer_steps() const { return optimizer_->steps_taken(); }

std::vector<OwnedSlice> Trainer::owned_state() {
  // Tensors every tp rank holds whole are written by tp rank 0; a pipeline copy of the tied
  // embedding by the first stage, which owns it.
  const bool write_replicated = !groups_.tp || groups_.tp->rank() == 0;
  std::vector<OwnedSlice> owned = optimizer_->owned_slices();
  // Replicas hold the same state: the first writes it (an expert's, the first of its holders).
  if (!optimizer_->shards_state_over_data_parallel())
    std::erase_if(owned, [&](const OwnedSlice& slice) {
      return slice.param->expert_sharded ? groups_.expert_replica_rank != 0 : groups_.replica_rank != 0;
    });
  std::erase_if(owned, [](const OwnedSlice& slice) { return slice.param->pipeline_copy; });
  return in_whole_tensor_coordinates(owned, write_replicated);
}

AsyncCheckpointOptions Trainer::checkpoint_options() const {
  const bool victim = config_.inject.kill_rank == groups_.world_rank && launch_attempt() == 0;
  return {config_.checkpoint_dir, static_cast<int>(config_.keep_last), config_.commit_timeout_s,
          config_.inject.slow_checkpoint_write_ms,
          victim ? config_.inject.kill_in_checkpoint_write : 0};
}

std::string Trainer::save(int64_t step) {
  const AsyncCheckpointOptions options = checkpoint_options();
  const AfterFileHook hook = checkpoint_fault_hook(options, step, groups_.world_rank);
  if (writes_sharded()) {
    const nlohmann::json state = trainer_state(step);
    slow_checkpoint_write(options);
    return save_sharded_checkpoint(*groups_.world, config_.checkpoint_dir, step, config_.model,
                                   state, owned_state(), static_cast<int>(config_.keep_last), hook);
  }
  if (!is_rank0()) return "";
  slow_checkpoint_write(options);
  return save_checkpoint(
      config_.checkpoint_dir, step,
      make_checkpoint_payload(*model_, optimizer_state_tensors(optimizer_->owned_slices()),
                              trainer_state(step)),
      static_cast<int>(config_.keep_last), hook);
}

std::string Trainer::checkpoint_in_run(int64_t step, std::vector<nlohmann::json>& records) {
  if (checkpointer_) {
    const nlohmann::json state = trainer_state(step);  // collective under pp: on this thread
    const std::string dir =
        writes_sharded()
            ? checkpointer_->save_sharded(step, config_.model, state, owned_state())
            : checkpointer_->save_single_file(step, *model_, optimizer_->owned_slices(), state);
    for (nlohmann::json& record : checkpointer_->take_records())
      records.push_back(std::move(record));
    return dir;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = save(step);
  const double blocked_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  records.push_back({{"kind", "checkpoint"},
                     {"step", step},
                     {"async", false},
                     {"blocked_ms", blocked_ms},
                     {"waited_ms", 0.0}});
  records.push_back({{"kind", "checkpoint_written"},
                     {"step", step},
                     {"dir", dir},
                     {"write_ms", blocked_ms},
                     {"bytes", dir.empty() ? uint64_t{0} : directory_bytes(dir)},
                     {"steps_during_write", 0}});
  return dir;
}

int64_t Trainer::restore(const std::string& dir_or_root) {
  const CheckpointReader reader(dir_or_root);
  require_resumable(reader, config_.model, global_tokens_per_step(),
                    precision_name(config_.precision));
  const nlohmann::json& state = reader.trainer_state();
  const int64_t optimizer_steps = state.value("optimizer_steps", int64_t{0});
  load_owned_state(reader, in_whole_tensor_coordinates(optimizer_->owned_slices()));
  optimizer_->set_steps_taken(optimizer_steps);
  optimizer_->publish_parameters();
  if (state.contains("moe_bias")) model_->set_moe_biases(state.at("moe_bias").get<std::vector<float>>());
  if (state.contains("bad_steps")) bad_steps_.restore(state.at("bad_steps"));
  if (fp8_ && state.contains("fp8_amax_history"))
    fp8_->set_amax_history(state.at("fp8_amax_history").get<std::vector<float>>());
  train_loader_->restore(loader_state_from_json(state.at("loader"), reader.dir()));
  return state.at("step").get<int64_t>();
}

void Trainer::initialise_from(const std::string& hf_dir) {
  const CheckpointReader reader = CheckpointReader::hugging_face_model(hf_dir);
  require_same_model(config_.model, reader.config(), "train.init_from '" + hf_dir + "'");
  load_owned_weights(reader, in_whole_tensor_coordinates(optimizer_->owned_slices()));
  optimizer_->publish_parameters();
}

}  // namespace loom
