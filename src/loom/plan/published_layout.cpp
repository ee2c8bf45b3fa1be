// Reading a published run's layout (parallelism.*): tp, pp, cp, ep, dp and total_gpus, the ZeRO
// stage (stated, from the fsdp text, or a rule), sequence parallelism, the chunks per rank and a
// named pipeline schedule; what is left out is a rule recorded in the run's assumptions or a
// search flagged in run.unstated (published_check.cpp picks it).
#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/plan/published_fields.hpp"
#include "loom/plan/published_runs.hpp"

namespace loom::plan::published_detail {

void read_layout(const RunFields& f, PublishedRun& run) {
  f.require_object("parallelism");
  PlanLayout& l = run.layout;
  l.tp = std::max<int64_t>(1, f.integer("parallelism.tp").value_or(1));
  l.pp = std::max<int64_t>(1, f.integer("parallelism.pp").value_or(1));
  l.cp = std::max<int64_t>(1, f.integer("parallelism.cp").value_or(1));
  l.ep = std::max<int64_t>(1, f.integer("parallelism.ep").value_or(1));
  run.unstated.ep = !f.integer("parallelism.ep").has_value();
  const std::optional<int64_t> dp = f.integer("parallelism.dp"),
                               total = f.integer("parallelism.total_gpus");
  if (total && *total == 0) throw_error("published run '", run.id, "': parallelism.total_gpus = 0");
  const int64_t model_parallel = l.tp * l.pp * l.cp;
  if (dp) {
    l.dp = std::max<int64_t>(1, *dp);
    if (total && *total != l.gpus()) {
      // The rule: total_gpus is what ran; dp is what is left over once tp x pp x cp is placed.
      if (*total % model_parallel != 0)
        throw Refusal{"parallelism.total_gpus = " + std::to_string(*total) +
                      " is not a multiple of tp x pp x cp = " + std::to_string(model_parallel)};
      l.dp = *total / model_parallel;
      run.assumptions.push_back("total_gpus " + std::to_string(*total) +
                                " != tp x pp x dp x cp as written: dp = " + std::to_string(l.dp));
    }
  } else {
    if (!total) throw Refusal{"neither parallelism.dp nor parallelism.total_gpus is stated"};
    if (*total % model_parallel != 0)
      throw Refusal{"parallelism.total_gpus = " + std::to_string(*total) +
                    " is not a multiple of tp x pp x cp"};
    l.dp = *total / model_parallel;
    if (!f.integer("parallelism.tp")) {
      run.unstated.tp = true;  // searched with dp in published_check
      run.assumptions.push_back(
          "tp and dp not stated: tp the fastest power of two within a node (to 16) that fits, dp = "
          "total_gpus / (tp x pp x cp)");
    } else {
      run.assumptions.push_back("dp not stated: total_gpus / (tp x pp x cp) = " +
                                std::to_string(l.dp));
    }
  }
  // ZeRO stage: stated; else read from the fsdp text; else Megatron's distributed optimizer
  // (ZeRO-1, no extra traffic: a reduce-scatter and an all-gather move what one all-reduce
  // does) for Megatron stacks with dp > 1, and plain data parallelism for others.
  // A stage written as text ("ZeRO-1", "stage 3") is its digit.
  std::optional<int64_t> stated_zero;
  if (const json* z = f.find("parallelism.zero_stage");
      z != nullptr && z->is_string() && says_not_stated(z->get<std::string>())) {
    stated_zero = std::nullopt;
  } else if (z != nullptr && z->is_string()) {
    std::smatch digit;
    const std::string t = z->get<std::string>();
    if (!std::regex_search(t, digit, std::regex(R"(^\D*([0-3])\D*$)")))
      throw_error("published run '", run.id, "': parallelism.zero_stage = \"", t,
                  "\" names no stage 0-3");
    stated_zero = std::stoll(digit[1].str());
  } else {
    stated_zero = f.integer("parallelism.zero_stage");
  }
  if (const std::optional<int64_t> z = stated_zero) {
    if (*z > 3)
      throw_error("published run '", run.id, "': parallelism.zero_stage = ", *z, " is not 0-3");
    l.zero_stage = static_cast<int>(*z);
  } else {
    std::string fsdp = lowercase(trimmed(f.text("parallelism.fsdp")));
    // An FSDP column's 0 / 1 (or off / on, false / true): off or on.
    if (const int word = on_off_word(fsdp); word >= 0) fsdp = word == 1 ? "fsdp" : "fsdp=0";
    if (says_not_stated(fsdp)) fsdp.clear();
    if (!fsdp.empty() && !contains_any(fsdp, {"zero-2", "zero2", "grads sharded"}).empty()) {
      l.zero_stage = 2;
    } else if (!fsdp.empty() && !contains_any(fsdp, {"ddp", "fsdp=0"}).empty()) {
      // Megatron's "DDP" (no FSDP) still shards the optimizer: its performance recipes run the
      // distributed optimizer (use_distributed_optimizer=True).
      l.zero_stage = run.conventions.megatron && l.dp * l.cp > 1 ? 1 : 0;
    } else if (!fsdp.empty() && fsdp.find("fsdp") != std::string::npos) {
      l.zero_stage = 3;
    } else {
      l.zero_stage = run.conventions.megatron && l.dp * l.cp > 1 ? 1 : 0;
      if (l.zero_stage == 1)
        run.assumptions.push_back("ZeRO stage not stated: 1 (Megatron's distributed optimizer)");
      else if (l.dp * l.cp > 1)
        run.unstated.zero = true;  // 0 or 1, said with the pick
      else
        run.assumptions.push_back("ZeRO stage not stated: 0");
    }
    if (!fsdp.empty())
      run.assumptions.push_back("ZeRO stage " + std::to_string(l.zero_stage) + " read from fsdp '" +
                                f.text("parallelism.fsdp") + "'");
  }
  // Sequence parallelism moves the same bytes as tp's all-reduces (Korthikanti et al. sec.
  // 4.2.2) and divides the norms' activations by t, so a run that does not say is taken to use it.
  if (const std::optional<bool> sp = f.flag("parallelism.sequence_parallel")) {
    l.sequence_parallel = *sp && l.tp > 1;
  } else if (run.conventions.unstated_sp_off) {
    l.sequence_parallel = false;
    if (l.tp > 1)
      run.assumptions.push_back("sequence_parallel not stated: off (" +
                                run.conventions.unstated_off_why + ")");
  } else {
    l.sequence_parallel = l.tp > 1;
    run.unstated.sp_follows_tp = true;
    if (l.tp > 1) run.assumptions.push_back("sequence_parallel not stated: on (tp > 1)");
  }
  const std::optional<int64_t> vp = f.integer("parallelism.vp");
  l.vp = std::max<int64_t>(1, vp.value_or(1));
  run.unstated.vp = !vp && l.pp > 1;
  // A schedule the planner models by name: DeepSeek's DualPipe (its V form, DualPipeV: two
  // chunks a rank; the bidirectional original has the same bubble and overlap with twice the
  // parameters a rank), zero-bubble ZB-H1 and ZB-V (Qi et al. 2023), GPipe / all-forward-all-
  // backward. Its chunks per rank follow from it.
  const std::string named_schedule = lowercase(f.text("parallelism.pp_schedule"));
  if (l.pp > 1) {
    struct Named {
      std::vector<std::string> spellings;
      PipelineSchedule schedule;
      int64_t chunks;
      const char* said;
    };
    static const std::vector<Named> kNamed = {
        {{"dualpipe"},
         PipelineSchedule::DualPipeV,
         2,
         "DualPipeV (two chunks a rank in a V; DeepSeek-V3's bidirectional DualPipe has its bubble "
         "and its compute-communication overlap, with two copies of the parameters)"},
        {{"zb-v", "zbv", "zero bubble v", "zero-bubble v"},
         PipelineSchedule::ZeroBubbleV,
         2,
         "ZB-V (Qi et al. 2023: two chunks a rank in a V)"},
        {{"zb-h1", "zbh1", "zero bubble", "zero-bubble", "zb1p"},
         PipelineSchedule::ZeroBubbleH1,
         1,
         "ZB-H1 (Qi et al. 2023: backward split into input and weight gradients)"},
        {{"gpipe", "afab", "all-forward", "all forward"},
         PipelineSchedule::AllForwardAllBackward,
         1,
         "all forward then all backward (GPipe)"}};
    for (const Named& n : kNamed)
      if (std::any_of(n.spellings.begin(), n.spellings.end(), [&](const std::string& spelling) {
            return named_schedule.find(spelling) != std::string::npos;
          })) {
        run.named_schedule = n.schedule;
        if (vp && *vp != n.chunks)
          throw Refusal{"pp_schedule '" + f.text("parallelism.pp_schedule") + "' runs " +
                        std::to_string(n.chunks) + " chunk(s) a rank, not the stated vp " +
                        std::to_string(*vp)};
        l.vp = n.chunks;
        run.unstated.vp = false;
        run.assumptions.push_back("pp_schedule '" + f.text("parallelism.pp_schedule") +
                                  "': " + n.said);
        break;
      }
  }
  // A schedule named without interleaving ("1F1B", "GPipe", "AFAB") runs one chunk per rank.
  const bool says_interleaved = named_schedule.find("interleav") != std::string::npos &&
                                named_schedule.find("non-interleav") == std::string::npos;
  if (run.unstated.vp && !says_interleaved &&
      !contains_any(named_schedule, {"1f1b", "gpipe", "afab", "all-forward"}).empty()) {
    run.unstated.vp = false;
    run.assumptions.push_back("pp_schedule '" + f.text("parallelism.pp_schedule") +
                              "': one chunk per rank (V = 1)");
  }
  if (run.unstated.vp && named_schedule.empty() && run.conventions.unstated_pp_one_chunk) {
    run.unstated.vp = false;
    run.assumptions.push_back("pp_schedule not stated: 1F1B, one chunk per rank (" +
                              run.conventions.unstated_one_chunk_why + ")");
  }
  // A schedule stated as interleaved runs at least two model chunks per rank (Narayanan et al.
  // 2021 sec. 2.2.2), whatever V the source leaves out; "non-interleaved" says the opposite.
  const std::string schedule = lowercase(f.text("parallelism.pp_schedule"));
  if (run.unstated.vp && schedule.find("interleav") != std::string::npos &&
      schedule.find("non-interleav") == std::string::npos) {
    run.unstated.interleaved = true;
    run.assumptions.push_back(
        "pp_schedule interleaved, V not stated: V >= 2 (the fastest that fits, else 2)");
  }
  // DeepSpeed's ZeRO-3 moves its gathers and reduce-scatters as the ZeRO++ paper describes
  // (sec. 3), not as the hierarchical NCCL collectives FSDP and Megatron use.
  if (l.zero_stage == 3 &&
      !contains_any(lowercase(f.text("parallelism.notes") + " " + f.text("parallelism.fsdp")),
                    {"deepspeed"})
           .empty()) {
    run.deepspeed_zero3 = true;
    run.assumptions.push_back(
        "DeepSpeed ZeRO-3 (parallelism text): every gather and reduce-scatter crosses each GPU's "
        "own network link, "
        "parameters gathered again for recomputation (ZeRO++ sec. 3)");
  }
}

}  // namespace loom::plan::published_detail
