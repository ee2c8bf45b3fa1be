#pragma once
// One layout of a training job over ranks: the degree of every parallel dimension (pp, dp, cp,
// ep, tp, as dist/device_mesh orders them), the model chunks per pipeline rank, the ZeRO stage,
// the micro-batch, the recomputation mode, sequence parallelism and the pipeline schedule. It
// is the one description the planner ranks and prints, `loom plan --layout` and the [parallel]
// table read, and the trainer's device mesh is cut from.
//
// Its rules come at two levels (check_layout): whether the layout can run the model at all
// (heads over tp, layers over stages, ...), and whether this engine runs it yet (no context or
// expert parallelism, no KV-head replication, no ZeRO-2/3 under a pipeline). The planner ranks
// layouts that pass the first level and marks those that fail the second; the trainer refuses
// both, with the same message.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/dist/device_mesh.hpp"
#include "loom/model/config.hpp"
#include "loom/parallel/pipeline_schedule.hpp"

namespace loom {

// How attention reaches the chunks of the sequence other cp ranks hold (parallel/
// context_parallel): the ring of key/value blocks, an all-gather of them, or Ulysses's
// all-to-all from sequence-sharded to head-sharded.
enum class CpComm { P2P, AllGather, AllToAll };
const char* cp_comm_name(CpComm comm);  // "p2p", "allgather", "a2a"
// Throws loom::Error naming `config_key`, the value and the choices.
CpComm parse_cp_comm(const std::string& name, const std::string& config_key = "parallel.cp_comm");

struct ParallelLayout {
  int64_t tp = 1, pp = 1, vp = 1, dp = 1, cp = 1, ep = 1;  // vp: model chunks per pp rank (v)
  CpComm cp_comm = CpComm::P2P;  // with cp > 1
  int zero_stage = 0;
  int64_t micro_batch = 1;  // sequences per micro-batch per dp rank
  Recompute recompute = Recompute::None;
  bool sequence_parallel = false;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;

  int64_t gpus() const { return tp * pp * dp * cp; }  // ep reuses the dp x cp ranks
  // "tp=2 pp=4 dp=8 zero=1 mbs=1 recompute=selective": what parse_layout reads back.
  std::string describe() const;
  // The device mesh of these degrees. Experts shard over ranks that would otherwise be data-
  // parallel replicas: where ep divides dp the mesh's dp axis is dp / ep and ep an axis of its
  // own; where it divides only dp x cp the mesh has no ep axis (ep = 1) and the trainer cuts the
  // dp x cp replicas, cp fastest, into consecutive groups of ep (Megatron-Core's expert ranks,
  // which span the context-parallel ones). Throws loom::Error when ep divides neither.
  MeshShape mesh_shape() const;
  // True when ep divides dp x cp but not dp: the experts spread over context-parallel ranks.
  bool ep_spans_cp() const { return ep > 1 && dp % ep != 0 && (dp * cp) % ep == 0; }
};

// Reads a layout as describe() prints it ("tp=2 pp=4 v=2 dp=8 zero=1 mbs=1 recompute=selective
// sp interleaved") or comma-separated ("tp=2,pp=4,v=2,sp=1,schedule=interleaved"): any subset,
// any order. Keys: tp, pp, v (or vp), dp, cp, cp_comm, ep, zero, mbs, recompute, sp, schedule; bare
// words: sp, afab, 1f1b, interleaved. v > 1 without a schedule means interleaved. Unknown keys,
// keys given twice and bad values are errors naming them. `keys_given`, when not null, receives
// the keys the text sets (bare words under their key: "sp", "schedule").
ParallelLayout parse_layout(const std::string& text,
                            std::vector<std::string>* keys_given = nullptr);

enum class LayoutRules {
  Valid,   // the layout can run the model at all
  Engine,  // ... and this engine runs it today
};

struct LayoutProblem {
  std::string key;      // the layout key at fault: tp, pp, v, dp, cp, cp_comm, ep, zero, mbs, sp, schedule
  std::string message;  // what is wrong and what would work, naming layout and model keys
  LayoutRules level = LayoutRules::Valid;  // Engine: valid, but not supported yet
  std::string feature;  // Engine: what the engine lacks, in a few words ("KV-head replication")
};

// Every problem of `layout` for `model` at `seq_len` tokens per sequence, those that make it
// invalid first. The model key "model" marks what the engine lacks for the model itself
// (mixture-of-experts layers), whatever the layout.
std::vector<LayoutProblem> layout_problems(const ParallelLayout& layout, const ModelConfig& model,
                                           int64_t seq_len);

// Throws loom::Error "layout <describe>: <message>" for the first problem at `rules` (Engine
// includes Valid's).
void check_layout(const ParallelLayout& layout, const ModelConfig& model, int64_t seq_len,
                  LayoutRules rules = LayoutRules::Valid);

// "" when the engine runs `layout`, else "engine: not yet supported: KV-head replication, ..."
// (the features; check_layout at Engine gives the whole message).
std::string engine_support_note(const ParallelLayout& layout, const ModelConfig& model,
                                int64_t seq_len);

}  // namespace loom
