#pragma once
// One layer's compute and communication for one micro-batch (layer_cost.cpp): the GEMMs, the
// attention core or Mamba-2 scans, the memory-bound work, and the tp, cp and ep collectives of
// the mean layer (a hybrid's blocks weighted by their counts). Internal to time_model.cpp, which
// turns it into passes, stages and a step.
#include "loom/model/config.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

struct LayerCost {
  double forward_s = 0, backward_s = 0;  // one layer, one micro-batch, compute only
  double weight_grad_s = 0;              // the part of backward_s a split backward's W does
  double attention_core_s = 0;           // forward QK^T and PV (recomputed by selective)
  double tp_comm_s = 0;                  // forward + backward (Megatron TP)
  double tp_exposed_forward_s = 0, tp_exposed_backward_s = 0;  // what the GEMMs do not hide
  double ep_comm_s = 0;  // expert dispatch and combine all-to-alls, forward + backward
  double cp_comm_s = 0;  // context parallelism, forward + backward
  double cp_exposed_forward_s = 0,
         cp_exposed_backward_s = 0;  // what the attention core does not hide
  // loom's CPU engine in FP8 under the current recipe: the amax all-reduces each pass waits for
  // (engine_fp8.hpp; the forward's again in backward under full recomputation).
  double fp8_reduce_forward_s = 0, fp8_reduce_backward_s = 0;
};

LayerCost layer_cost(const ModelConfig& m, const PlanLayout& l, const ClusterSpec& cluster,
                     const TrainingJob& job, const GemmEfficiency& gemm);

}  // namespace loom::plan
