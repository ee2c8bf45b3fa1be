#pragma once
// Asynchronous checkpoints (checkpoint.async, on by default). A save costs the training thread
// one copy of the state this rank writes into host buffers (page-locked on a CUDA build, and
// reused from one save to the next); a background thread then writes and fsyncs the files
// while training goes on. Protocol, per save of step N:
//   1. wait for the previous write, then commit it: ranks agree on its outcome with a
//      collective on the training thread (MPI is not thread-multiple: the writer never talks),
//      and rank 0 publishes it (index, manifest, rename into step_<N>, `latest` by rename);
//   2. snapshot step N's state into the host buffers;
//   3. start the writer: the files go into "step_<N>.tmp-<token>"; a sharded rank's
//      description, written last and atomically, is its done marker.
// The end of the run commits the last save. A kill at any point leaves `latest` on the last
// committed checkpoint; the temp directory is never loaded and is removed on the next start
// (ckpt_files::remove_partial_checkpoints).
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/ckpt/sharded_checkpoint.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/model/transformer.hpp"
#include "loom/optim/optimizer.hpp"

namespace loom {

struct AsyncCheckpointOptions {
  std::string root;
  int keep_last = 2;
  double commit_timeout_s = 600.0;  // checkpoint.commit_timeout_s
  double slow_write_ms = 0.0;       // debug.slow_checkpoint_write_ms
  int64_t kill_at_step = 0;         // this rank dies mid-write of this step's checkpoint; 0: never
};

// Sleeps `slow_write_ms`; the hook that SIGKILLs this process after the first file of step
// `step`'s checkpoint when `kill_at_step` == step (else an empty hook). For both save modes.
void slow_checkpoint_write(const AsyncCheckpointOptions& options);
AfterFileHook checkpoint_fault_hook(const AsyncCheckpointOptions& options, int64_t step, int rank);

class AsyncCheckpointer {
 public:
  // `world`: every rank of the run (null for a single process); every public call below is
  // collective over it, made at the same steps on every rank.
  AsyncCheckpointer(AsyncCheckpointOptions options, std::shared_ptr<ProcessGroup> world);
  // Waits (up to commit_timeout_s) for a write in flight and commits nothing.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Sharded format: every rank writes `owned` (checkpointing.hpp). Returns the directory the
  // save will be committed to.
  std::string save_sharded(int64_t step, const ModelConfig& config,
                           const nlohmann::json& trainer_state,
                           const std::vector<OwnedSlice>& owned);
  // Single-file format: rank 0 snapshots the model's weights and `owned` (whole parameters)
  // and writes; the others only take part in the agreement.
  std::string save_single_file(int64_t step, const Transformer& model,
                               const std::vector<OwnedSlice>& owned,
                               const nlohmann::json& trainer_state);
  // Waits for the write in flight and commits it: its directory, or "" when none was in
  // flight. Throws on every rank when the write failed on any.
  std::string finish();
  // The training thread calls this after every step, on every rank: while a write is in
  // flight, one tiny all-reduce asks whether every rank's writer is done, and if so the save is
  // committed at once (as finish()); else the step is counted as done during the write.
  void step_done();
  // Metrics records since the last call: {"kind": "checkpoint"} per save (blocked_ms: the
  // training thread's cost, of which waited_ms for the previous write) and
  // {"kind": "checkpoint_written"} per commit (write_ms, bytes, steps_during_write).
  std::vector<nlohmann::json> take_records();

 private:
  struct Staging;
  struct Write;
  std::string start(int64_t step, bool sharded, const ModelConfig& config,
                    const nlohmann::json& trainer_state,
                    std::chrono::steady_clock::time_point called, double waited_ms);
  void wait_for_writer();

  AsyncCheckpointOptions options_;
  std::shared_ptr<ProcessGroup> world_;
  int rank_ = 0;
  std::shared_ptr<Staging> staging_;  // shared with the writer thread
  std::unique_ptr<Write> pending_;
  std::vector<nlohmann::json> records_;
};

// Total bytes of the regular files in a directory (0 when it does not exist).
uint64_t directory_bytes(const std::filesystem::path& dir);

}  // namespace loom
