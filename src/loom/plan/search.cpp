#include "loom/plan/search.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/core/error.hpp"
#include "loom/model/fp8_linear.hpp"

namespace loom::plan {

namespace {

std::vector<int64_t> divisors_up_to(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Calls `visit` for every layout the model allows on `gpus` GPUs (check_layout passes).
template <typename Visit>
void for_each_layout(const ModelConfig& m, int64_t gpus, int64_t gpus_per_node, int64_t seq_len, Visit visit) {
  for (int64_t tp = 1; tp <= std::min<int64_t>(gpus_per_node, m.n_head); tp *= 2) {
    for (int64_t cp = 1; cp <= 16; cp *= 2) {
      if (cp > 1 && seq_len % (2 * cp) != 0) continue;
      for (int64_t pp : divisors_up_to(m.n_layer, 128)) {
        if (gpus % (tp * cp * pp) != 0) continue;
        const int64_t dp = gpus / (tp * cp * pp);
        for (int64_t vp : {1, 2, 4}) {
          if (vp > 1 && (pp == 1 || m.n_layer % (pp * vp) != 0)) continue;
          // Expert parallelism: any divisor of the expert count that divides dp x cp.
          for (int64_t ep : divisors_up_to(m.is_moe() ? m.n_experts : 1, dp * cp)) {
            if ((dp * cp) % ep != 0) continue;
            for (int zero = 0; zero <= 3; ++zero) {
              if (zero > 0 && dp * cp == 1) continue;  // nothing to shard over
              for (Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full}) {
                // The three ways attention reaches the other cp ranks' chunks.
                for (CpComm cp_comm : {CpComm::P2P, CpComm::AllGather, CpComm::AllToAll}) {
                  if (cp == 1 && cp_comm != CpComm::P2P) continue;
                  PlanLayout l;
                  l.tp = tp, l.cp = cp, l.pp = pp, l.dp = dp, l.vp = vp, l.ep = ep, l.zero_stage = zero;
                  l.cp_comm = cp_comm;
                  l.recompute = recompute;
                  l.sequence_parallel = tp > 1;  // same traffic as plain TP, less activation memory
                  l.schedule = vp > 1 ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
                  try {
                    check_layout(l, m, seq_len);
                  } catch (const Error&) {
                    continue;
                  }
                  visit(l);
                  // One chunk per rank: zero-bubble ZB-H1 too (zero_stage <= 1 with pp).
                  if (pp > 1 && vp == 1 && zero <= 1) {
                    l.schedule = PipelineSchedule::ZeroBubbleH1;
                    visit(l);
                  }
                  // Two chunks per rank: ZB-V too, when the layers cut into 2p equal stages.
                  if (pp > 1 && vp == 2 && zero <= 1 && m.n_layer % (2 * pp) == 0) {
                    l.schedule = PipelineSchedule::ZeroBubbleV;
                    visit(l);
                    l.schedule = PipelineSchedule::DualPipeV;
                    visit(l);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

bool fits_in_hbm(const MemoryBreakdown& m, double hbm_bytes, bool contiguous_states) {
  if (!contiguous_states) return m.total() <= hbm_bytes * kUsableMemoryFraction;
  return m.parameters + m.gradients + m.optimizer_state + m.workspace + (m.activations + m.comm_buffers) / kUsableMemoryFraction <=
         hbm_bytes;
}

namespace {

bool fits_somewhere(const ModelConfig& m, int64_t gpus, const ClusterSpec& cluster, const TrainingJob& job) {
  bool fits = false;
  for_each_layout(m, gpus, cluster.gpus_per_node, job.seq_len, [&](PlanLayout l) {
    if (fits) return;
    GpuJob mem = job.memory;
    mem.seq_len = job.seq_len;
    mem.micro_batches = std::max<int64_t>(1, job.global_batch / l.dp);
    fits = fits_in_hbm(predict_gpu_memory(m, l, mem), cluster.gpu.hbm_bytes, false);
  });
  return fits;
}

}  // namespace

std::string engine_note_on(const GpuSpec& gpu, const PlanLayout& layout, const ModelConfig& model,
                           int64_t seq_len, const TrainingJob& job) {
  std::string note = engine_support_note(layout, model, seq_len);
  auto lacks = [&](const std::string& feature) {
    note += (note.empty() ? "engine: not yet supported: " : ", ") + feature;
  };
  if (job.frozen_base) lacks("LoRA fine-tuning (loom's trainer trains every weight)");
  if (amd_part(gpu)) lacks("AMD GPUs (loom's GPU engine is CUDA)");
  if (job.fp4_gemms)
    lacks("NVFP4 (loom trains FP8 with per-tensor or 128-tile scales)");
  else if (job.mx_gemms)
    lacks("MXFP8 (loom trains FP8 with per-tensor or 128-tile scales)");
  if (job.engine_fp8.recipe == EngineFp8Recipe::Blockwise) {
    // The trainer's own refusal (fp8_config): tp slices or cp chunks that cut 128-wide tiles.
    const std::string cut = blockwise_tiles_cut(model, layout.tp, layout.cp, seq_len);
    if (!cut.empty()) lacks("blockwise FP8 on this layout (" + cut + ")");
  }
  return note;
}

SearchResult search_layouts(const ModelConfig& m, const ClusterSpec& cluster, const TrainingJob& job, int64_t simulate_top) {
  cluster.validate();
  SearchResult result;
  result.usable_bytes = cluster.gpu.hbm_bytes * kUsableMemoryFraction;
  bool have_least = false;
  const int64_t gpus = cluster.gpus();
  for_each_layout(m, gpus, cluster.gpus_per_node, job.seq_len, [&](PlanLayout base) {
    for (int64_t mbs : {1, 2, 4, 8}) {
      PlanLayout l = base;
      l.micro_batch = mbs;
      ++result.valid;
      GpuJob mem = job.memory;
      mem.seq_len = job.seq_len;
      const bool batch_ok = job.global_batch % (l.dp * mbs) == 0;
      mem.micro_batches = std::max<int64_t>(1, job.global_batch / (l.dp * mbs));
      const MemoryBreakdown memory = predict_gpu_memory(m, l, mem);
      if (!have_least || memory.total() < result.least_memory.memory.total()) result.least_memory = {l, memory, {}, ""};
      have_least = true;
      if (!fits_in_hbm(memory, cluster.gpu.hbm_bytes, false)) continue;
      ++result.fitting;
      if (!batch_ok) continue;
      if (l.schedule == PipelineSchedule::Interleaved && mem.micro_batches % l.pp != 0) continue;
      if (stage_placement(l.schedule) == StagePlacement::V && mem.micro_batches < 2 * l.pp) continue;
      ++result.batch_ok;
      TrainingJob j = job;
      j.memory = mem;
      result.ranked.push_back({l, memory, predict_step_time(m, l, cluster, j, false),
                               engine_note_on(cluster.gpu, l, m, job.seq_len, job)});
    }
  });
  // Fastest first; layouts within 0.1% of each other are a tie the model cannot resolve, so
  // the one that moves less over the network (then needs less memory) goes first.
  auto faster = [](const Candidate& a, const Candidate& b) {
    const auto bucket = [](const Candidate& c) { return std::llround(std::log(c.time.tokens_per_s) / std::log(1.001)); };
    if (bucket(a) != bucket(b)) return bucket(a) > bucket(b);
    const auto traffic = [](const Candidate& c) {
      return c.time.tp_comm_s + c.time.dp_comm_s + c.time.cp_comm_s + c.time.pp_comm_s + c.time.ep_comm_s;
    };
    if (traffic(a) != traffic(b)) return traffic(a) < traffic(b);
    return a.memory.total() < b.memory.total();
  };
  std::sort(result.ranked.begin(), result.ranked.end(), faster);
  // The closed-form bubble ranked everything; simulate the schedules of the best few exactly.
  const size_t top = std::min(result.ranked.size(), static_cast<size_t>(std::max<int64_t>(simulate_top, 1)));
  for (size_t i = 0; i < top; ++i) {
    Candidate& c = result.ranked[i];
    TrainingJob j = job;
    j.memory.seq_len = job.seq_len;
    j.memory.micro_batches = job.global_batch / (c.layout.dp * c.layout.micro_batch);
    c.time = predict_step_time(m, c.layout, cluster, j, true);
  }
  std::sort(result.ranked.begin(), result.ranked.begin() + static_cast<std::ptrdiff_t>(top), faster);
  if (result.fitting == 0) {
    for (int64_t n = std::max<int64_t>(gpus * 2, cluster.gpus_per_node); n <= (int64_t{1} << 22); n *= 2) {
      if (fits_somewhere(m, n, cluster, job)) {
        result.gpus_needed = n;
        break;
      }
    }
  }
  return result;
}

std::string explain_winner(const SearchResult& r) {
  if (r.ranked.empty()) return "no layout fits";
  const Candidate& w = r.ranked[0];
  if (r.ranked.size() == 1) return "the only layout that fits and splits the batch";
  const Candidate& s = r.ranked[1];
  char line[512];
  if (std::fabs(w.time.tokens_per_s / s.time.tokens_per_s - 1) < 1e-3) {
    const auto traffic = [](const Candidate& c) {
      return c.time.tp_comm_s + c.time.dp_comm_s + c.time.cp_comm_s + c.time.pp_comm_s + c.time.ep_comm_s;
    };
    std::snprintf(line, sizeof line,
                  "%s ties with the runner-up (%s) within the model's 0.1%% resolution and goes first because it "
                  "%s (%.3f vs %.3f s of communication per step; %.1f vs %.1f GiB)",
                  w.layout.describe().c_str(), s.layout.describe().c_str(),
                  traffic(w) < traffic(s) ? "moves less data" : "needs no more memory", traffic(w), traffic(s),
                  w.memory.total() / (1 << 30), s.memory.total() / (1 << 30));
    return line;
  }
  const std::pair<const char*, double> parts[] = {
      {"compute (incl. recomputation)", s.time.compute_s - w.time.compute_s},
      {"exposed communication", s.time.exposed_comm_s - w.time.exposed_comm_s},
      {"pipeline bubble", s.time.bubble_s - w.time.bubble_s},
      {"optimizer step", s.time.optimizer_s - w.time.optimizer_s}};
  const auto best = std::max_element(std::begin(parts), std::end(parts),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  std::snprintf(line, sizeof line, "%s beats the runner-up (%s) by %.1f%% tokens/s, mostly through %s: %.3f s less per step",
                w.layout.describe().c_str(), s.layout.describe().c_str(),
                100 * (w.time.tokens_per_s / s.time.tokens_per_s - 1), best->first, best->second);
  return line;
}

}  // namespace loom::plan
