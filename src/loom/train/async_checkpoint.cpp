#include "loom/train/async_checkpoint.hpp"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "loom/ckpt/checkpoint.hpp"
#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}
}  // namespace

void slow_checkpoint_write(const AsyncCheckpointOptions& options) {
  if (options.slow_write_ms > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(options.slow_write_ms));
}

AfterFileHook checkpoint_fault_hook(const AsyncCheckpointOptions& options, int64_t step, int rank) {
  if (options.kill_at_step <= 0 || options.kill_at_step != step) return {};  // 0: never
  return [step, rank](const std::string& file) {
    std::fprintf(
        stderr,
        "debug.kill_in_checkpoint_write: rank %d kills itself after writing %s of step %lld\n",
        rank, file.c_str(), static_cast<long long>(step));
    std::fflush(stderr);
    ::raise(SIGKILL);
  };
}

uint64_t directory_bytes(const std::filesystem::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.is_regular_file(ec)) total += entry.file_size(ec);
  return total;
}

// The host copies of one save, reused by the next: one slot per tensor, reallocated only when
// a shape changes. On a CUDA build host CommBuffers are page-locked (core/device_memory.cpp),
// so the device-to-host copies run at full bus speed.
struct AsyncCheckpointer::Staging {
  std::vector<Tensor> slots;
  size_t used = 0;
  // What the writer reads: shard pieces (sharded), or weights and moments (single file).
  std::vector<ShardSlice> slices;
  std::vector<Parameter> params;
  std::vector<std::pair<std::string, Tensor>> optimizer_state;

  std::vector<std::vector<float>> transposed;  // HF layout of Conv1D weights, reused

  // The single-file checkpoint's tensors over the snapshot, weights in HF layout (as
  // export_hf_weights gives them: GPT-2's Conv1D weights transposed, into `transposed`).
  CheckpointSpans single_file_spans(const ModelConfig& config,
                                    const nlohmann::json& trainer_state) {
    CheckpointSpans spans;
    spans.config = config;
    spans.trainer_state = trainer_state;
    transposed.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& value = params[i].value;
      const auto bytes = static_cast<size_t>(value.numel()) * sizeof(float);
      if (!params[i].hf_transposed || value.dim() != 2) {
        spans.model_weights.push_back(
            {params[i].name, "F32", value.shape(), {{value.f32(), bytes}}});
        continue;
      }
      const int64_t rows = value.size(0), cols = value.size(1);
      std::vector<float>& out = transposed[i];
      out.resize(static_cast<size_t>(rows * cols));
      const float* in = value.f32();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out[static_cast<size_t>(c * rows + r)] = in[r * cols + c];
      spans.model_weights.push_back({params[i].name, "F32", {cols, rows}, {{out.data(), bytes}}});
    }
    for (const auto& [name, tensor] : optimizer_state)
      spans.optimizer_state.push_back(
          {name,
           "F32",
           tensor.shape(),
           {{tensor.f32(), static_cast<size_t>(tensor.numel()) * sizeof(float)}}});
    return spans;
  }

  const Tensor& copy(const Tensor& source, const Shape& shape) {
    if (used == slots.size()) slots.emplace_back();
    Tensor& slot = slots[used++];
    if (!slot.defined() || slot.shape() != shape)
      slot = Tensor::empty(shape, DType::F32, MemCategory::CommBuffers);
    slot.copy_from(source);
    return slot;
  }
};

// One write in flight: what the writer thread reports, and what the commit needs.
struct AsyncCheckpointer::Write {
  int64_t step = 0;
  bool sharded = false;
  std::filesystem::path temp_dir;  // sharded
  std::string final_dir;
  ModelConfig config;
  nlohmann::json trainer_state;
  int64_t steps_during_write = 0;
  std::thread thread;
  // Shared with the thread, which may outlive this record when a wait times out.
  struct Outcome {
    std::mutex mutex;
    std::condition_variable finished;
    std::atomic<bool> done{false};
    std::string error;
    double write_ms = 0;
  };
  std::shared_ptr<Outcome> outcome = std::make_shared<Outcome>();
};

AsyncCheckpointer::AsyncCheckpointer(AsyncCheckpointOptions options,
                                     std::shared_ptr<ProcessGroup> world)
    : options_(std::move(options)),
      world_(std::move(world)),
      staging_(std::make_shared<Staging>()) {
  rank_ = world_ ? world_->rank() : 0;
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!pending_ || !pending_->thread.joinable()) return;
  std::unique_lock<std::mutex> lock(pending_->outcome->mutex);
  const bool done = pending_->outcome->finished.wait_for(
      lock, std::chrono::duration<double>(options_.commit_timeout_s),
      [&] { return pending_->outcome->done.load(); });
  lock.unlock();
  // A writer stuck on a dead disk holds only what it shares (staging, outcome): let it go.
  if (done)
    pending_->thread.join();
  else
    pending_->thread.detach();
}

void AsyncCheckpointer::step_done() {
  if (!pending_) return;
  // Commit as soon as every rank's writer is done, not only at the next save: a rank lost
  // between two saves must find the earlier one complete on relaunch. One flag per rank,
  // reduced while a write is in flight (the ranks call this at the same steps).
  float writing = pending_->outcome->done.load() ? 0.0f : 1.0f;
  if (world_ && world_->size() > 1) comm::all_reduce(*world_, &writing, 1, ReduceOp::Max)->wait();
  if (writing > 0.0f) {
    ++pending_->steps_during_write;
    return;
  }
  finish();
}

std::vector<nlohmann::json> AsyncCheckpointer::take_records() {
  return std::exchange(records_, {});
}

void AsyncCheckpointer::wait_for_writer() {
  Write& write = *pending_;
  if (!write.thread.joinable()) return;
  std::unique_lock<std::mutex> lock(write.outcome->mutex);
  if (!write.outcome->finished.wait_for(lock,
                                        std::chrono::duration<double>(options_.commit_timeout_s),
                                        [&] { return write.outcome->done.load(); }))
    throw_error(
        "checkpoint step ", write.step, ": the background write has not finished after ",
        options_.commit_timeout_s, " s (checkpoint.commit_timeout_s); the disk under '",
        options_.root,
        "' may be stalled. Raise checkpoint.commit_timeout_s, or set checkpoint.async = false");
  lock.unlock();
  write.thread.join();
}

std::string AsyncCheckpointer::finish() {
  if (!pending_) return "";
  wait_for_writer();  // on a timeout the write stays pending, for the destructor
  const std::unique_ptr<Write> write = std::move(pending_);
  const std::string error = write->outcome->error;
  std::string dir;
  if (write->sharded) {
    dir = commit_sharded_save(*world_, write->temp_dir, options_.root, write->step, write->config,
                              write->trainer_state, options_.keep_last, error);
  } else {
    // Rank 0 wrote and installed the checkpoint; every rank learns whether it did.
    float ok = error.empty() ? 1.0f : 0.0f;
    if (world_ && world_->size() > 1) comm::broadcast(*world_, &ok, 1, 0)->wait();
    if (ok == 0.0f)
      throw_error(rank_ == 0 ? error
                             : "checkpoint step " + std::to_string(write->step) +
                                   ": rank 0 could not write it (its own error says why)");
    if (rank_ == 0) dir = write->final_dir;
  }
  records_.push_back({{"kind", "checkpoint_written"},
                      {"step", write->step},
                      {"dir", dir},
                      {"write_ms", write->outcome->write_ms},
                      {"bytes", rank_ == 0 ? directory_bytes(dir) : uint64_t{0}},
                      {"steps_during_write", write->steps_during_write}});
  return dir;
}

std::string AsyncCheckpointer::save_sharded(int64_t step, const ModelConfig& config,
                                            const nlohmann::json& trainer_state,
                                            const std::vector<OwnedSlice>& owned) {
  const auto called = Clock::now();
  finish();
  const double waited_ms = ms_since(called);
  if (!world_) throw_error("the sharded checkpoint format needs a process group");
  pending_ = std::make_unique<Write>();
  pending_->temp_dir = begin_sharded_save(*world_, options_.root, step);
  Staging& staging = *staging_;
  staging.used = 0;
  staging.slices =
      shard_slices(owned, [&](const Tensor& t) { return staging.copy(t, t.shape()).f32(); });
  return start(step, true, config, trainer_state, called, waited_ms);
}

std::string AsyncCheckpointer::save_single_file(int64_t step, const Transformer& model,
                                                const std::vector<OwnedSlice>& owned,
                                                const nlohmann::json& trainer_state) {
  const auto called = Clock::now();
  finish();
  const double waited_ms = ms_since(called);
  pending_ = std::make_unique<Write>();
  if (rank_ == 0) {
    Staging& staging = *staging_;
    staging.used = 0;
    staging.params.clear();
    for (const Parameter* p : model.parameters())
      staging.params.push_back({p->name, staging.copy(p->value, p->value.shape()), Tensor(),
                                p->weight_decay, p->hf_transposed, p->placement, p->pipeline_copy,
                                p->expert_sharded});
    // The same tensors, names and checks as optimizer_state_tensors (checkpointing.hpp).
    staging.optimizer_state.clear();
    for (const OwnedSlice& slice : owned) {
      if (slice.start != 0 || slice.count != shape_numel(slice.shape))
        throw_error("the single-file checkpoint holds whole tensors; '", slice.param->name,
                    "' is owned from element ", slice.start, ": use the sharded format");
      staging.optimizer_state.emplace_back(slice.param->name + ".exp_avg",
                                           staging.copy(slice.exp_avg, slice.shape));
      staging.optimizer_state.emplace_back(slice.param->name + ".exp_avg_sq",
                                           staging.copy(slice.exp_avg_sq, slice.shape));
      if (slice.master.defined())
        staging.optimizer_state.emplace_back(slice.param->name + ".master",
                                             staging.copy(slice.master, slice.shape));
    }
  }
  return start(step, false, model.config(), trainer_state, called, waited_ms);
}

std::string AsyncCheckpointer::start(int64_t step, bool sharded, const ModelConfig& config,
                                     const nlohmann::json& trainer_state, Clock::time_point called,
                                     double waited_ms) {
  Write& write = *pending_;
  write.step = step;
  write.sharded = sharded;
  write.final_dir = (std::filesystem::path(options_.root) / checkpoint_dir_name(step)).string();
  write.config = config;
  write.trainer_state = trainer_state;
  if (sharded || rank_ == 0) {
    const int world = world_ ? world_->size() : 1;
    write.thread =
        std::thread([staging = staging_, outcome = write.outcome, options = options_, step, sharded,
                     temp_dir = write.temp_dir, rank = rank_, world, config, trainer_state] {
          const auto begin = Clock::now();
          try {
            slow_checkpoint_write(options);
            const AfterFileHook hook = checkpoint_fault_hook(options, step, rank);
            if (sharded) {
              write_checkpoint_shard(temp_dir, rank, world, staging->slices, hook);
            } else {
              save_checkpoint_spans(options.root, step,
                                    staging->single_file_spans(config, trainer_state),
                                    options.keep_last, hook);
            }
          } catch (const std::exception& e) {
            outcome->error = e.what();
          }
          std::lock_guard<std::mutex> lock(outcome->mutex);
          outcome->write_ms = ms_since(begin);
          outcome->done = true;
          outcome->finished.notify_all();
        });
  }
  records_.push_back({{"kind", "checkpoint"},
                      {"step", step},
                      {"async", true},
                      {"blocked_ms", ms_since(called)},
                      {"waited_ms", waited_ms}});
  // As the synchronous single-file save, only the writing rank names the directory.
  return sharded || rank_ == 0 ? write.final_dir : "";
}

}  // namespace loom
