#pragma once
// `loom launch`: runs a training command (mpirun / srun / loom train ...) and relaunches it when
// it fails, so a job lives through a lost rank or node: each relaunch resumes from the newest
// complete checkpoint (checkpoint.resume, on by default), and since the data position and every
// random stream are saved with it, the restarted run ends with the weights of an uninterrupted
// one.
//
// The launcher and the ranks talk through a directory named by LOOM_LAUNCH_DIR: every rank of
// an attempt that reaches its first training step touches `started` (a run that fails before it
// has a configuration or setup error, which would fail again, so it is not relaunched), and a
// rank that fails with an error writes it to `rank-<R>.txt`, which the launcher names in its log
// line. LOOM_LAUNCH_ATTEMPT is the attempt's number, 0 first.
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct LaunchOptions {
  std::vector<std::string> command;
  int64_t max_restarts = 3;
  double backoff_s = 5.0;       // before the first relaunch; doubled each time
  double max_backoff_s = 300.0;
};

// Runs `command` until it succeeds, fails before training starts, or has failed
// max_restarts + 1 times. Returns the exit code to leave with (0, or the last attempt's).
int launch_with_restarts(const LaunchOptions& options);

// For the ranks: LOOM_LAUNCH_ATTEMPT (0 when not under `loom launch`).
int64_t launch_attempt();
// Touches LOOM_LAUNCH_DIR/started, if under `loom launch`.
void mark_launch_started();
// Writes `message` to LOOM_LAUNCH_DIR/rank-<R>.txt (R from the launcher's environment: Open
// MPI, PMI or Slurm), if under `loom launch`.
void report_launch_failure(const std::string& message);

}  // namespace loom
