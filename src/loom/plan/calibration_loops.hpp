#pragma once
// The timed loops `loom calibrate` measures with, shared by the CPU engine's measurements
// (machine_calibration.cpp) and the CUDA engine's (cuda_calibration.cpp). Internal to those two.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/plan/machine_calibration.hpp"

namespace loom::plan::calibration {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Deterministic values in [-scale, scale], spread so that no product or sum is trivial (zeros
// would let a GPU run its tensor cores at less power, hence faster, than training's data).
inline void fill(float* v, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i)
    v[i] = scale * static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) / 1000.0f;
}
inline void fill(std::vector<float>& v, float scale) { fill(v.data(), v.size(), scale); }

// The mean over ranks of each rank's figure.
inline double mean_over_ranks(ProcessGroup& world, double value) {
  float v = static_cast<float>(value);
  world.all_reduce(&v, 1, ReduceOp::Avg)->wait();
  return static_cast<double>(v);
}

inline double max_over_ranks(ProcessGroup& world, double value) {
  float v = static_cast<float>(value);
  world.all_reduce(&v, 1, ReduceOp::Max)->wait();
  return static_cast<double>(v);
}

// The calls a timed loop makes for it to last o.min_loop_seconds, one call having taken
// `probe` seconds: at least 1, at most `most`.
inline int64_t loop_calls(const CalibrationOptions& o, double probe, int64_t most) {
  return std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(o.min_loop_seconds / std::max(probe, 1e-7))), 1, most);
}

// A compute op's warm-up (page in the buffers, size OpenBLAS's workspace, pick cuBLASLt's
// algorithm) and probe on every rank at once, timed until the last rank is done: the calls its
// timed loops make (loop_calls).
template <class Op, class Wait>
int64_t probe_loop_calls(ProcessGroup& world, const CalibrationOptions& o, Op&& op, Wait&& wait) {
  world.barrier();
  op();
  wait();
  world.barrier();
  const Clock::time_point start = Clock::now();
  op();
  wait();
  return loop_calls(o, max_over_ranks(world, seconds_since(start)), 1000000);
}

// Seconds per call of `op`, run on every rank at once: the same number of calls on every rank
// (from a probe), timed from a barrier until the last rank is done, so that ranks sharing
// cores (or a GPU) are charged the machine's whole time for their calls (as in training, where
// the slowest rank sets the pace) even where the scheduler ran some loops before others; the
// best loop of `repeats`. `wait` runs after the calls and before the clock is read: nothing on
// the CPU, where an op returns once done; a device synchronise on a GPU, where it returns once
// queued (without it the probe would time the launches alone and ask for far too many calls).
template <class Op, class Wait>
double compute_seconds(ProcessGroup& world, const CalibrationOptions& o, Op&& op, Wait&& wait) {
  const int64_t calls = probe_loop_calls(world, o, op, wait);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < o.repeats; ++r) {
    world.barrier();
    const Clock::time_point start = Clock::now();
    for (int64_t c = 0; c < calls; ++c) op();
    wait();
    best = std::min(best, max_over_ranks(world, seconds_since(start)) / static_cast<double>(calls));
  }
  return best;
}

// Compute ops timed in interleaved rounds: `add` registers each op (it must stay callable, and
// what it captures alive, until `run`); `run` warms each up and sizes its loop
// (probe_loop_calls), then times `repeats` rounds, each one loop of every op in turn, and
// each op keeps the median of its loops. On a machine whose speed drifts (other tenants' load,
// clocks) the rounds spread each op's loops over the whole measurement, and the median is the
// speed the machine typically gives, which is what a training step of seconds averages over:
// on a shared 2-core machine one GEMM's 20 ms loops ran at 60-80 GFLOP/s over half a minute
// (median 66), and back-to-back repeats of one op, best kept, timed the same GEMM 10-20%
// apart in calibrations a minute apart, a whole block of shapes at once.
class ComputeRounds {
 public:
  ComputeRounds(ProcessGroup& world, const CalibrationOptions& o) : world_(world), o_(o) {}
  size_t add(std::function<void()> op) {
    ops_.push_back({std::move(op), 1, {}});
    return ops_.size() - 1;
  }
  void run() {
    for (Timed& t : ops_) t.calls = probe_loop_calls(world_, o_, t.op, [] {});
    for (int r = 0; r < o_.repeats; ++r)
      for (Timed& t : ops_) {
        world_.barrier();
        const Clock::time_point start = Clock::now();
        for (int64_t c = 0; c < t.calls; ++c) t.op();
        t.loops.push_back(max_over_ranks(world_, seconds_since(start)) /
                          static_cast<double>(t.calls));
      }
  }
  // Seconds per call of the op `add` numbered `slot`, the median of its loops; after run().
  double seconds(size_t slot) const {
    std::vector<double> loops = ops_.at(slot).loops;
    if (loops.empty())
      throw_error("calibrate: op ", slot, " has no timed loops (run() not called, or repeats < 1)");
    std::sort(loops.begin(), loops.end());
    const size_t half = loops.size() / 2;
    return loops.size() % 2 ? loops[half] : (loops[half - 1] + loops[half]) / 2;
  }

 private:
  struct Timed {
    std::function<void()> op;
    int64_t calls;
    std::vector<double> loops;  // seconds per call, one per round
  };
  ProcessGroup& world_;
  const CalibrationOptions& o_;
  std::vector<Timed> ops_;
};

// Seconds per call of a communication `op` every rank issues (and waits for): the same number
// of calls on every rank (from a probe), best of `repeats` loops, averaged over the ranks.
template <class Op>
double comm_seconds(ProcessGroup& world, const CalibrationOptions& o, Op&& op) {
  world.barrier();
  Clock::time_point start = Clock::now();
  op();
  const int64_t calls = loop_calls(o, max_over_ranks(world, seconds_since(start)), 100000);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < o.repeats; ++r) {
    world.barrier();
    start = Clock::now();
    for (int64_t c = 0; c < calls; ++c) op();
    best = std::min(best, seconds_since(start) / static_cast<double>(calls));
  }
  return mean_over_ranks(world, best);
}

// The MPI collectives and send/recv over `world` into entry.comm and entry.comm_timings, on f32
// buffers of `device` through dist/tensor_comm as training moves gradients: host buffers go
// straight to MPI; device buffers are staged through page-locked host memory, and those copies
// are part of what is measured. Collective over `world`; call with 2 ranks or more.
void measure_comm(ProcessGroup& world, const CalibrationOptions& o, Device device,
                  ProfileEntry& entry);

}  // namespace loom::plan::calibration
