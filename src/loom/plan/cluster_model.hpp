#pragma once
// The infrastructure cost of a training job: facility power and energy, how often the job
// is interrupted, how often to checkpoint, the share of wall time that does useful steps
// (goodput), and from those the wall time, GPU-hours and price. Failures are modelled as a
// Poisson process (constant rate), the assumption behind Young's and Daly's results.
#include "loom/plan/hardware.hpp"

namespace loom::plan {

struct ClusterEstimate {
  double power_mw = 0;     // facility power: IT power x PUE
  double it_power_mw = 0;  // GPUs at the given fraction of TDP plus per-node overhead
  double energy_mwh = 0;   // facility power x wall time
  double failures_per_day = 0;
  double mtbf_hours = 0;  // whole job: any GPU or node failing stops it
  double checkpoint_write_s = 0;
  double checkpoint_interval_s = 0;  // compute time between checkpoints, Daly's optimum
  double goodput = 0;                // useful compute time / wall time, in [0, 1]
  double wall_time_hours = 0;        // +infinity when goodput is 0 (the job cannot finish)
  double gpu_hours = 0;
  double cost = 0;  // gpu_hours x price_per_gpu_hour; 0 when unpriced
};

// step_seconds: one optimizer step's compute time; tokens_per_step: global batch in tokens;
// checkpoint_bytes: one whole-job checkpoint (all ranks); gpu_utilisation_power_fraction:
// average GPU draw as a fraction of TDP, in (0, 1]. Throws a loom::Error naming the argument.
ClusterEstimate estimate_cluster(const ClusterSpec& cluster, double step_seconds,
                                 double tokens_per_step, double tokens_to_train,
                                 double checkpoint_bytes,
                                 double gpu_utilisation_power_fraction = 1.0);

// The pieces, exposed so tests and the planner can check them alone. All times in seconds.
// Young (1974): tau = sqrt(2 delta M), first order in delta/M.
double young_checkpoint_interval_s(double write_s, double mtbf_s);
// Daly (2006): Young's interval with higher-order terms; M itself once delta >= 2M.
double daly_checkpoint_interval_s(double write_s, double mtbf_s);
// Daly (2006) expected run time under Poisson failures, as useful fraction of wall time.
double checkpoint_goodput(double interval_s, double write_s, double restart_s, double mtbf_s);

}  // namespace loom::plan
