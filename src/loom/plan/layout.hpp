#pragma once
// One candidate way to lay a training job over GPUs: the degrees of every parallel dimension
// on the device mesh (pp, dp, cp, ep, tp, as dist/device_mesh orders them), the ZeRO stage,
// the micro-batch and the recomputation mode. The planner predicts and ranks these.
#include <cstdint>
#include <string>

#include "loom/model/config.hpp"
#include "loom/parallel/pipeline_schedule.hpp"

namespace loom::plan {

using loom::PipelineSchedule;

struct PlanLayout {
  int64_t tp = 1, pp = 1, vp = 1, dp = 1, cp = 1, ep = 1;  // vp: virtual stages per pp rank
  int zero_stage = 0;
  int64_t micro_batch = 1;  // sequences per micro-batch per dp rank
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;

  int64_t gpus() const { return tp * pp * dp * cp; }  // ep reuses the dp x cp ranks
  std::string describe() const;  // "tp=2 pp=4 dp=8 zero=1 mbs=1 recompute=selective"
};

// "tp=2,pp=4,dp=8,cp=1,v=1,ep=1,zero=1,mbs=2,recompute=selective,sp=1,schedule=1f1b" (any
// subset, any order; spaces allowed). Unknown keys and bad values are errors naming them.
PlanLayout parse_layout(const std::string& text);

// Throws loom::Error saying why the layout cannot run this model: heads or KV heads not
// divisible by tp, layers not divisible by pp x vp, sequence not divisible by cp, ZeRO stage
// out of range, interleaving without pipelining, sequence parallelism without tp.
void check_layout(const PlanLayout& layout, const ModelConfig& model, int64_t seq_len);

}  // namespace loom::plan
