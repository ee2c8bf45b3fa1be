#include "loom/plan/cluster_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/error.hpp"

namespace loom::plan {
namespace {

constexpr double kSecondsPerHour = 3600;
constexpr double kHoursPerDay = 24;
constexpr double kWattsPerMegawatt = 1e6;

// `!(value > 0)` so NaN fails as well as zero and negatives.
void require_positive(const char* where, const char* argument, double value) {
  if (!(value > 0 && std::isfinite(value)))
    throw_error(where, ": ", argument, " = ", value, " must be a positive, finite number");
}

}  // namespace

// J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
// 1974: minimising checkpoint cost delta/tau plus expected rework tau/(2M) gives sqrt(2 delta M).
double young_checkpoint_interval_s(double write_s, double mtbf_s) {
  require_positive("young_checkpoint_interval_s", "write_s", write_s);
  require_positive("young_checkpoint_interval_s", "mtbf_s", mtbf_s);
  return std::sqrt(2 * write_s * mtbf_s);
}

// J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
// Future Generation Computer Systems 22(3), 2006: a perturbation solution for the minimum
// of the wall-time cost function in checkpoint_goodput below,
//   tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta,  delta < 2M
//   tau = M,                                                                        delta >= 2M.
// Young's sqrt(2 delta M) is its leading term; the correction matters once delta nears M.
double daly_checkpoint_interval_s(double write_s, double mtbf_s) {
  require_positive("daly_checkpoint_interval_s", "write_s", write_s);
  require_positive("daly_checkpoint_interval_s", "mtbf_s", mtbf_s);
  if (write_s >= 2 * mtbf_s) return mtbf_s;
  const double xi = write_s / (2 * mtbf_s);
  return std::sqrt(2 * write_s * mtbf_s) * (1 + std::sqrt(xi) / 3 + xi / 9) - write_s;
}

// Daly (2006), complete model: with failures at rate 1/M at any time (also while writing a
// checkpoint or restarting), work done in segments of tau compute plus delta writing, and a
// restart of R after each failure, the expected wall time for T_s of compute is
//   T_w = M e^{R/M} (e^{(tau + delta)/M} - 1) T_s / tau,
// so goodput = T_s / T_w = tau / (M e^{R/M} (e^{(tau + delta)/M} - 1)). For tau, delta, R << M
// it reduces to the familiar expected-loss model
//   goodput ~ 1/(1 + delta/tau) x (1 - (R + (tau + delta)/2) / M):
// the share of time not spent writing checkpoints, times the share not lost to failures, each
// costing a restart plus on average half a segment of rework. The exact form stays in (0, 1]
// where the first-order one would go negative (M short against tau + delta + R).
double checkpoint_goodput(double interval_s, double write_s, double restart_s, double mtbf_s) {
  require_positive("checkpoint_goodput", "interval_s", interval_s);
  require_positive("checkpoint_goodput", "mtbf_s", mtbf_s);
  if (!(write_s >= 0) || !(restart_s >= 0))
    throw_error("checkpoint_goodput: write_s = ", write_s, " and restart_s = ", restart_s,
                " must be >= 0");
  // expm1 keeps precision when (tau + delta) << M; an overflow to infinity reads as goodput 0.
  const double wall_per_interval =
      mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1((interval_s + write_s) / mtbf_s);
  return std::clamp(interval_s / wall_per_interval, 0.0, 1.0);
}

ClusterEstimate estimate_cluster(const ClusterSpec& cluster, double step_seconds,
                                 double tokens_per_step, double tokens_to_train,
                                 double checkpoint_bytes, double gpu_utilisation_power_fraction) {
  cluster.validate();
  require_positive("estimate_cluster", "step_seconds", step_seconds);
  require_positive("estimate_cluster", "tokens_per_step", tokens_per_step);
  require_positive("estimate_cluster", "tokens_to_train", tokens_to_train);
  require_positive("estimate_cluster", "checkpoint_bytes", checkpoint_bytes);
  if (!(gpu_utilisation_power_fraction > 0 && gpu_utilisation_power_fraction <= 1))
    throw_error("estimate_cluster: gpu_utilisation_power_fraction = ",
                gpu_utilisation_power_fraction, " must be in (0, 1] (average draw / TDP)");

  const double gpus = static_cast<double>(cluster.gpus());
  const double nodes = static_cast<double>(cluster.nodes);
  ClusterEstimate out;

  // Power: GPUs at their average share of TDP, plus each node's fixed overhead, times PUE
  // (The Green Grid, "PUE: a comprehensive examination of the metric", WP#49, 2012).
  const double it_watts = gpus * cluster.gpu.tdp_watts * gpu_utilisation_power_fraction +
                          nodes * cluster.node_overhead_watts;
  out.it_power_mw = it_watts / kWattsPerMegawatt;
  out.power_mw = out.it_power_mw * cluster.pue;

  // Independent exponential failures add their rates; a synchronous job stops on any of them
  // (Llama 3 §3.3.4: "a single GPU failure may require a restart of the entire job").
  const double failures_per_hour = gpus / cluster.gpu_mtbf_hours + nodes / cluster.node_mtbf_hours;
  out.failures_per_day = failures_per_hour * kHoursPerDay;
  out.mtbf_hours = 1 / failures_per_hour;
  const double mtbf_s = out.mtbf_hours * kSecondsPerHour;

  // A blocking checkpoint write at the file system's aggregate bandwidth.
  out.checkpoint_write_s = checkpoint_bytes / cluster.storage_write_bytes_per_s;
  out.checkpoint_interval_s = daly_checkpoint_interval_s(out.checkpoint_write_s, mtbf_s);
  out.goodput = checkpoint_goodput(out.checkpoint_interval_s, out.checkpoint_write_s,
                                   cluster.restart_seconds, mtbf_s);

  // A partial last step still costs a whole step.
  const double steps = std::ceil(tokens_to_train / tokens_per_step);
  const double ideal_hours = steps * step_seconds / kSecondsPerHour;
  out.wall_time_hours =
      out.goodput > 0 ? ideal_hours / out.goodput : std::numeric_limits<double>::infinity();
  out.gpu_hours = gpus * out.wall_time_hours;
  out.energy_mwh = out.power_mw * out.wall_time_hours;
  out.cost = cluster.price_per_gpu_hour > 0 ? out.gpu_hours * cluster.price_per_gpu_hour : 0;
  return out;
}

}  // namespace loom::plan
