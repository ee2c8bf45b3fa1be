// Machine profiles (`loom calibrate`, `loom plan --profile`): the alpha-beta fit, the profile
// file and its errors, measured collective costs in the time model, measured attention rates.
// Expected values are worked out by hand from the formulas in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/machine_profile.hpp"
#include "loom/plan/memory_model.hpp"
#include "loom/plan/time_model.hpp"
#include "test_support.hpp"

namespace loom::plan {
namespace {

#define EXPECT_THROW_MSG(statement, text) \
  loom::test::expect_contains(loom::test::error_message([&] { (void)(statement); }), {text})

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("loom_profile_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(PlanProfile, AlphaBetaFitRecoversExactLatencyAndBandwidth) {
  // t = 5 us + bytes / 2 GB/s at 4 KiB .. 8 MiB: the fit's residual is zero at exactly (5e-6, 2e9).
  std::vector<MessageTiming> timings;
  for (double bytes : {4096.0, 65536.0, 1048576.0, 8388608.0}) timings.push_back({bytes, 5e-6 + bytes / 2e9});
  const Link link = fit_alpha_beta(timings);
  EXPECT_NEAR(link.latency_s, 5e-6, 1e-12);
  EXPECT_NEAR(link.bytes_per_s / 2e9, 1.0, 1e-9);
}

TEST(PlanProfile, AlphaBetaFitWithoutLatencyIsPureBandwidth) {
  // t = bytes / 1 GB/s - 1 us would need a negative latency: the fit takes latency 0 and the
  // bandwidth minimising sum (b x_i / t_i - 1)^2, i.e. b = sum(v) / sum(v^2) with v = x / t.
  std::vector<MessageTiming> timings;
  double sv = 0, svv = 0;
  for (double bytes : {1e4, 1e5, 1e6}) {
    const double t = bytes / 1e9 - 1e-6;
    timings.push_back({bytes, t});
    sv += bytes / t, svv += (bytes / t) * (bytes / t);
  }
  const Link link = fit_alpha_beta(timings);
  EXPECT_EQ(link.latency_s, 0.0);
  EXPECT_NEAR(link.bytes_per_s, svv / sv, 1e-6 * link.bytes_per_s);
}

TEST(PlanProfile, AlphaBetaFitRefusesTooFewSizesOrFlatTimes) {
  EXPECT_THROW_MSG(fit_alpha_beta({{4096, 1e-5}}), "at least two message sizes");
  EXPECT_THROW_MSG(fit_alpha_beta({{4096, 1e-5}, {4096, 2e-5}}), "at least two message sizes");
  EXPECT_THROW_MSG(fit_alpha_beta({{4096, 1e-3}, {8192, 1e-4}}), "do not grow with the message size");
  EXPECT_THROW_MSG(fit_alpha_beta({{4096, 0}, {8192, 1e-4}}), "expected both positive");
}

ProfileEntry sample_entry(int64_t ranks) {
  ProfileEntry e;
  e.ranks = ranks;
  e.peak_flops = 1e11;
  e.gemm = {0.8, 16};
  e.gemm_timings = {{128, 256, 64, 1e-4}, {512, 1024, 256, 2e-3}};
  e.attention_forward = {0.5, 32};
  e.attention_backward = {0.25, 32};
  e.attention_forward_timings = {{512, 64.5, 64, 1e-4}, {2048, 256.5, 64, 1e-3}};
  e.attention_backward_timings = {{512, 64.5, 64, 3e-4}, {2048, 256.5, 64, 3e-3}};
  e.memory_bytes_per_s = 4e10;
  if (ranks > 1) {
    auto comm = std::make_shared<MeasuredComm>();
    comm->p2p = {4e-6, 1e10};
    comm->collectives.push_back({Collective::AllReduce, ranks, {2e-5, 2e9}});
    comm->collectives.push_back({Collective::AllGather, ranks, {1e-5, 4e9}});
    e.comm = comm;
    e.comm_timings.push_back({true, Collective::AllReduce, 2, {{4096, 4.4e-6}, {8192, 4.8e-6}}});
  }
  return e;
}

TEST(PlanProfile, FileRoundTripsAndMergesByRankCount) {
  MachineProfile profile;
  profile.machine = "test CPU (2 cores)";
  merge_profile_entry(profile, sample_entry(2));
  merge_profile_entry(profile, sample_entry(1));
  ProfileEntry again = sample_entry(2);
  again.memory_bytes_per_s = 3e10;
  merge_profile_entry(profile, again);  // replaces the first 2-rank entry
  ASSERT_EQ(profile.entries.size(), 2u);
  EXPECT_EQ(profile.entries[0].ranks, 1);  // kept in rank order
  const std::string path = temp_path("roundtrip.json");
  write_machine_profile(profile, path);
  const MachineProfile read = read_machine_profile(path);
  EXPECT_EQ(read.machine, "test CPU (2 cores)");
  const ProfileEntry& two = read.entry(2);
  EXPECT_EQ(two.memory_bytes_per_s, 3e10);
  EXPECT_EQ(two.gemm.peak_fraction, 0.8);
  EXPECT_EQ(two.attention_backward.peak_fraction, 0.25);
  ASSERT_TRUE(two.comm);
  EXPECT_EQ(two.comm->p2p.latency_s, 4e-6);
  const CollectiveFit* ag = two.comm->find(Collective::AllGather, 2);
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->cost.bytes_per_s, 4e9);
  EXPECT_EQ(two.comm->find(Collective::AllToAll, 2), nullptr);
  ASSERT_EQ(two.comm_timings.size(), 1u);
  EXPECT_TRUE(two.comm_timings[0].p2p);
  EXPECT_FALSE(read.entry(1).comm);
  EXPECT_THROW_MSG(read.entry(4), "no entry for 4 ranks (it has 1, 2); run `mpirun -np 4 loom calibrate");
  std::filesystem::remove(path);
}

TEST(PlanProfile, MoreRanksThanCoresComputeAtTheFullSpeedEntryAndShareTheCores) {
  // 2 cores, entries at 1, 2 and 4 ranks: 4 ranks take turns, so their compute rates are the
  // 2-rank entry's (each rank on a core of its own) and the time model shares the 2 cores; the
  // collectives are the 4-rank entry's, measured with all four running.
  MachineProfile profile;
  profile.machine = "test CPU (2 cores)";
  profile.cores = 2;
  merge_profile_entry(profile, sample_entry(1));
  ProfileEntry two = sample_entry(2);
  two.peak_flops = 2e11;
  merge_profile_entry(profile, two);
  ProfileEntry four = sample_entry(4);
  four.peak_flops = 5e10;
  merge_profile_entry(profile, four);
  const std::string path = temp_path("cores.json");
  write_machine_profile(profile, path);
  const MachineProfile read = read_machine_profile(path);
  EXPECT_EQ(read.cores, 2);
  const ProfiledMachine shared = profiled_machine(read, 4, 1e9);
  EXPECT_EQ(shared.cluster.cores, 2);
  EXPECT_EQ(shared.cluster.gpu.bf16_tflops, 2e11 / 1e12);
  EXPECT_EQ(shared.cluster.gpus_per_node, 4);
  ASSERT_TRUE(shared.cluster.measured_comm);
  EXPECT_NE(shared.cluster.measured_comm->find(Collective::AllReduce, 4), nullptr);
  const ProfiledMachine own = profiled_machine(read, 2, 1e9);  // as many ranks as cores: its own entry
  EXPECT_EQ(own.cluster.gpu.bf16_tflops, 2e11 / 1e12);
  EXPECT_EQ(own.cluster.cores, 0);
  // A profile that does not say its cores (written before the field) predicts each rank count
  // from its own entry.
  profile.cores = 0;
  write_machine_profile(profile, path);
  EXPECT_EQ(profiled_machine(read_machine_profile(path), 4, 1e9).cluster.gpu.bf16_tflops, 5e10 / 1e12);
  std::filesystem::remove(path);
}

TEST(PlanProfile, GpuProfileRoundTripsWithItsDeviceAndMemory) {
  // A `loom calibrate --device cuda` profile: the GPU's name as the machine, the CUDA engine as
  // the device, the visible GPUs as the processors the ranks share, one GPU's memory.
  MachineProfile profile;
  profile.machine = "NVIDIA H100 80GB HBM3 (1 GPU)";
  profile.device = Device::CUDA;
  profile.cores = 1;
  profile.gpu_memory_bytes = 85'520'809'984;
  ProfileEntry one = sample_entry(1);
  one.peak_flops = 7e14;
  one.stream_bytes_per_s = 2.5e12;
  merge_profile_entry(profile, one);
  merge_profile_entry(profile, sample_entry(2));  // two ranks sharing the one GPU
  const std::string path = temp_path("gpu.json");
  write_machine_profile(profile, path);
  const MachineProfile read = read_machine_profile(path);
  EXPECT_EQ(read.machine, "NVIDIA H100 80GB HBM3 (1 GPU)");
  EXPECT_EQ(read.device, Device::CUDA);
  EXPECT_EQ(read.cores, 1);
  EXPECT_EQ(read.gpu_memory_bytes, 85'520'809'984);
  EXPECT_EQ(read.entry(1).peak_flops, 7e14);
  EXPECT_EQ(read.entry(1).stream_bytes_per_s, 2.5e12);
  EXPECT_EQ(read.entry(2).stream_bytes_per_s, 0);  // not measured: not written
  EXPECT_THROW_MSG(read.entry(4), "run `mpirun -np 4 loom calibrate --device cuda --out FILE`");
  // The CUDA engine's bytes: bf16 working weights and activations, f32 gradients, masters and
  // moments, and the GPU model's workspace allowance; one GPU's memory for a rank of its own.
  EXPECT_EQ(memory_bytes_per_rank(read, 1, 1e12), 85'520'809'984.0);
  const ProfiledMachine m = profiled_machine(read, 1, memory_bytes_per_rank(read, 1, 1e12));
  EXPECT_EQ(m.cluster.gpu.bf16_tflops, 700);
  EXPECT_EQ(m.cluster.gpu.hbm_bytes, 85'520'809'984.0);
  EXPECT_EQ(m.job.memory.activation_bytes, 2);
  EXPECT_EQ(m.job.memory.state.parameter, 2);
  EXPECT_EQ(m.job.memory.state.gradient, 4);
  EXPECT_EQ(m.job.memory.state.master, 4);
  EXPECT_EQ(m.job.memory.state.moments, 8);
  EXPECT_EQ(m.job.memory.loom_cuda_device_memory, 85'520'809'984.0);  // the engine's workspace
  EXPECT_EQ(m.job.stream_bytes_per_s, 2.5e12);
  // Two ranks on one GPU share its memory and take turns on it: compute from the one-rank
  // entry, the time model sharing the GPU out, collectives from the two-rank entry.
  EXPECT_EQ(memory_bytes_per_rank(read, 2, 1e12), 85'520'809'984.0 / 2);
  const ProfiledMachine shared = profiled_machine(read, 2, memory_bytes_per_rank(read, 2, 1e12));
  EXPECT_EQ(shared.cluster.cores, 1);
  EXPECT_EQ(shared.cluster.gpu.bf16_tflops, 700);
  ASSERT_TRUE(shared.cluster.measured_comm);
  // The engine sizes its vocabulary chunk by the whole GPU, not a rank's share of it.
  EXPECT_EQ(shared.job.memory.loom_cuda_device_memory, 85'520'809'984.0);
  // A CPU profile is what it always was: host memory over the ranks, f32 everything.
  MachineProfile cpu;
  cpu.machine = "test CPU (2 cores)";
  merge_profile_entry(cpu, sample_entry(1));
  write_machine_profile(cpu, path);
  const MachineProfile cpu_read = read_machine_profile(path);
  EXPECT_EQ(cpu_read.device, Device::CPU);
  EXPECT_EQ(memory_bytes_per_rank(cpu_read, 4, 1e12), 2.5e11);
  EXPECT_EQ(profiled_machine(cpu_read, 1, 1e9).job.memory.activation_bytes, 4);
  EXPECT_EQ(profiled_machine(cpu_read, 1, 1e9).job.memory.workspace_bytes, 0);
  std::filesystem::remove(path);
}

// loom's CUDA engine's workspace, by hand from what it allocates (model/stash.cpp,
// Transformer::set_batch, kernels/cuda/cross_entropy.cu and ops_cuda.cu). With f32 logits and a
// separate bf16 gradient (what LOOM_CUDA_LOGITS=f32 still allocates) the same count gave what
// the allocator reported on an H100 80GB HBM3 (85,017,493,504 bytes) on 2026-11-27
// (docs/results/h100-2026-11-27) to the byte: GPT-2 124M, 16 x 1024, bf16: 5,497,635,072 bytes;
// llama-1b, 4 x 1024: 3,512,811,776. Since session 26 the bf16 logits hold their own gradient
// and the blocks carry one residual gradient in place (two [rows, d] buffers fewer): those
// figures less the f32 logits and the two buffers.
TEST(PlanProfile, CudaEngineWorkspaceIsWhatTheEngineAllocates) {
  const double h100 = 85'017'493'504.0;
  PlanLayout l;
  l.micro_batch = 16;
  // GPT-2: rows 16384, d 768. Block scratch (d_norm_out 768, d_qkv 2304, d_attn_out 768, the
  // MLP's 3072 + 3072, the residual gradient 768 = 10752 bf16 per row): 352,321,536; the head's
  // d_hidden 25,165,824; the targets (int32) 65,536. The whole vocabulary fits in 1/16 of the GPU
  // at 2 bytes a logit, so one chunk of 50257 with a stride of 50272: bf16 logits (and their
  // gradient) 1,647,312,896, four row statistics 262,144, the loss 256 (one aligned double), the
  // f32 d_hidden accumulator 50,331,648, and 50257 not a multiple of 16, its weight rows padded to
  // 50272: 77,217,792. The H100's 5,497,635,072 less its f32 logits' 3,294,625,792 and two 16384 x
  // 768 bf16 buffers (50,331,648).
  const double gpt2 = loom_cuda_workspace_bytes(model_preset("gpt2-124m"), l, 1024, h100, 2, true);
  EXPECT_EQ(gpt2, 352'321'536.0 + 25'165'824 + 65'536 + 1'647'312'896 + 262'144 + 256 + 50'331'648 +
                      77'217'792);
  EXPECT_EQ(gpt2, 5'497'635'072.0 - 3'294'625'792 - 50'331'648);
  // Not the last pipeline stage: the block scratch alone.
  EXPECT_EQ(loom_cuda_workspace_bytes(model_preset("gpt2-124m"), l, 1024, h100, 2, false),
            352'321'536.0);
  // llama-1b: rows 4096, d 2048, q|k|v 3072, SwiGLU 2 x 8192: (2048 + 5120 + 24576 + 2048)
  // bf16 per row = 276,824,064; d_hidden 16,777,216; targets 16,384; vocabulary 128256 in one
  // chunk (a multiple of 16: no padded copy): bf16 logits 1,050,673,152 + 65,536 + 256 +
  // 33,554,432. The H100's 3,512,811,776 less its f32 logits' 2,101,346,304 and two 4096 x
  // 2048 bf16 buffers (33,554,432).
  l.micro_batch = 4;
  const double llama = loom_cuda_workspace_bytes(model_preset("llama-1b"), l, 1024, h100, 2, true);
  EXPECT_EQ(llama, 276'824'064.0 + 16'777'216 + 16'384 + 1'050'673'152 + 65'536 + 256 + 33'554'432);
  EXPECT_EQ(llama, 3'512'811'776.0 - 2'101'346'304 - 33'554'432);
  // On a 24 GB GPU the logits no longer fit in 1/16 of it: 24e9 / 16 / (16384 x 2) = 45776
  // logits a row, rounded down to 1024s: chunks of 45056, the last 50257 - 45056 = 5201 wide
  // (padded to 5216). Logits 16384 x 45056 x 2 = 1,476,395,008; statistics, loss, accumulator
  // and targets as above; the padded rows 5216 x 768 x 2 = 8,011,776.
  l.micro_batch = 16;
  EXPECT_EQ(loom_cuda_vocab_chunk(model_preset("gpt2-124m"), l, 1024, 24e9, 2), 45056);
  EXPECT_EQ(
      loom_cuda_workspace_bytes(model_preset("gpt2-124m"), l, 1024, 24e9, 2, true),
      352'321'536.0 + 25'165'824 + 65'536 + 1'476'395'008 + 262'144 + 256 + 50'331'648 + 8'011'776);
  // tp 2 with sp: the block scratch on 8192 local rows for d_norm_out and the residual gradient
  // (768 + 768) and the whole 16384 for q|k|v, attention and MLP at half width (1152 + 384 +
  // 1536 + 1536): (8192 x 1536 + 16384 x 4608) x 2 = 176,160,768; d_hidden on 8192 rows
  // 12,582,912; targets 65,536; the shard's chunk min(50257, 25129) = 25129: f32 logits 16384 x
  // 25129 x 4 = 1,646,854,144 and bf16 gradients 823,427,072, the accumulator 50,331,648, and
  // the gathered hidden rows with their gradient 2 x 16384 x 768 x 2 = 50,331,648.
  l.tp = 2;
  l.sequence_parallel = true;
  EXPECT_EQ(
      loom_cuda_workspace_bytes(model_preset("gpt2-124m"), l, 1024, h100, 2, true),
      176'160'768.0 + 12'582'912 + 65'536 + 1'646'854'144 + 823'427'072 + 50'331'648 + 50'331'648);
  // The shard passes' 6 bytes a logit size the chunk under tp: on 24 GB, 24e9 / 16 / (16384 x
  // 6) = 15258, down to 14336 (2 bytes a logit would give 45056).
  EXPECT_EQ(loom_cuda_vocab_chunk(model_preset("gpt2-124m"), l, 1024, 24e9, 2), 14336);
}

// The head's d_hidden is written by the forward's fused loss and read by the backward, so every
// activation set that serves the last stage holds one (model/stash.cpp,
// add_last_stage_activations). Counted by hand from the schedules' lists on the rank holding
// the last stage (pp - 1; rank 0 under the V), through the pool's reuse rule (an idle set of as
// many layers is taken before a new one is made).
TEST(PlanProfile, CudaEngineHoldsOneHeadGradientPerLastStageSet) {
  const ModelConfig gpt2 = model_preset("gpt2-124m");  // 12 layers
  PlanLayout l;
  EXPECT_EQ(last_stage_activation_sets(gpt2, l, 8), 1);  // no pipeline: one set, reused
  l.pp = 2;
  // AFAB: rank 1 forwards all 8 micro-batches before its first backward.
  l.schedule = PipelineSchedule::AllForwardAllBackward;
  EXPECT_EQ(last_stage_activation_sets(gpt2, l, 8), 8);
  // 1F1B: the last rank alternates F, B from the start: one set, reused.
  l.schedule = PipelineSchedule::OneFOneB;
  EXPECT_EQ(last_stage_activation_sets(gpt2, l, 8), 1);
  // ZB-H1: the last rank runs 1F1B's F, B pairs (its W's follow each B): one set.
  l.schedule = PipelineSchedule::ZeroBubbleH1;
  EXPECT_EQ(last_stage_activation_sets(gpt2, l, 8), 1);
  // The workspace adds one d_hidden (16384 x 768 bf16 = 25,165,824 bytes) per set beyond the
  // first: AFAB's 8 sets, 7 more than 1F1B's one.
  const double h100 = 85'017'493'504.0;
  l.micro_batch = 16;
  EXPECT_EQ(loom_cuda_workspace_bytes(gpt2, l, 1024, h100, 2, true, 8) -
                loom_cuda_workspace_bytes(gpt2, l, 1024, h100, 2, true, 1),
            7 * 25'165'824.0);
}

// The CUDA engine's memory-bound kernels per layer, counted by hand (time_model.cpp's list):
// norms 16 x d per row (two norms: 2 tensors forward, 4 backward accumulating into the residual
// gradient, 2 for the weight partials); streams 10 x d per row (two residual adds forward, two
// residual-gradient copies backward) + 2 q (attention's row dot), and for Llama 4 (q + kv)
// (RoPE forward and backward) + 8 ffn (SwiGLU); bf16.
TEST(PlanProfile, CudaEngineMemoryBoundKernelsPerLayer) {
  TrainingJob job;
  job.seq_len = 1024;
  job.memory.activation_bytes = 2;
  job.stream_bytes_per_s = 2e12;
  PlanLayout l;
  l.micro_batch = 16;
  // GPT-2 124M, 16384 rows of 768: norms 16 x 768 x 16384 x 2 = 402,653,184 bytes at 1e12;
  // streams (10 + 2) x 768 x 16384 x 2 = 301,989,888 at 2e12.
  EXPECT_DOUBLE_EQ(loom_cuda_layer_memory_s(model_preset("gpt2-124m"), l, job, 1e12),
                   402'653'184 / 1e12 + 301'989'888 / 2e12);
  // llama-1b, 4096 rows of 2048 (q 2048, kv 512, ffn 8192): norms 16 x 2048 x 4096 x 2 =
  // 268,435,456; streams (10 x 2048 + 2 x 2048 + 4 x 2560 + 8 x 8192) x 4096 x 2 = 822,083,584.
  l.micro_batch = 4;
  EXPECT_DOUBLE_EQ(loom_cuda_layer_memory_s(model_preset("llama-1b"), l, job, 1e12),
                   268'435'456 / 1e12 + 822'083'584 / 2e12);
  // Without a streaming rate everything streams at the norms' rate.
  job.stream_bytes_per_s = 0;
  EXPECT_DOUBLE_EQ(loom_cuda_layer_memory_s(model_preset("llama-1b"), l, job, 1e12),
                   (268'435'456.0 + 822'083'584) / 1e12);
}

// Attention's efficiency from the timings themselves where the layer's head width was measured:
// at 1e12 FLOP/s, 2 x 1000 x 100 x 64 FLOPs in 64 us is 0.2 and 2 x 1000 x 400 x 64 in 128 us
// 0.4; 200 keys lie halfway between in log(keys): 0.3; beyond the ends the nearest; 3000
// tokens against the measured 1000 scale by the fit's 3000 / 4000 over 1000 / 2000 = 1.5
// (half_dim 1000); head_dim 128, never measured: the fit alone.
TEST(PlanProfile, AttentionEfficiencyReadFromTheTimings) {
  const std::vector<GemmTiming> timings = {{1000, 400, 64, 128e-6}, {1000, 100, 64, 64e-6}};
  const GemmEfficiency flat{0.5, 0};  // every dimension saturated: 0.5 everywhere
  EXPECT_DOUBLE_EQ(measured_efficiency(timings, flat, 1e12, 1000, 200, 64), 0.3);
  EXPECT_DOUBLE_EQ(measured_efficiency(timings, flat, 1e12, 1000, 50, 64), 0.2);
  EXPECT_DOUBLE_EQ(measured_efficiency(timings, flat, 1e12, 1000, 800, 64), 0.4);
  EXPECT_DOUBLE_EQ(measured_efficiency(timings, flat, 1e12, 1000, 128, 128), 0.5);
  const GemmEfficiency curved{0.5, 1000};
  EXPECT_DOUBLE_EQ(measured_efficiency(timings, curved, 1e12, 3000, 200, 64), 0.3 * 1.5);
  EXPECT_DOUBLE_EQ(measured_efficiency({}, curved, 1e12, 3000, 200, 64),
                   curved.efficiency(3000, 200, 64));
}

TEST(PlanProfile, GpuProfileFieldsAreChecked) {
  MachineProfile profile;
  profile.machine = "g";
  profile.device = Device::CUDA;
  profile.gpu_memory_bytes = 1 << 30;
  profile.entries.push_back(sample_entry(1));
  const std::string path = temp_path("gpu_bad.json");
  write_machine_profile(profile, path);
  std::ifstream in(path);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(path) << text;
    return path;
  };
  EXPECT_THROW_MSG(read_machine_profile(with("\"device\": \"cuda\"", "\"device\": \"tpu\"")),
                   "device: expected \"cpu\" or \"cuda\", got \"tpu\"");
  EXPECT_THROW_MSG(read_machine_profile(with("\"gpu_memory_bytes\"", "\"gpu_memory\"")),
                   "missing \"gpu_memory_bytes\"");
  // A file from before the device field is a CPU profile.
  EXPECT_EQ(read_machine_profile(with("\"device\": \"cuda\"", "\"devices\": \"cuda\"")).device,
            Device::CPU);
  std::filesystem::remove(path);
}

TEST(PlanProfile, FittedPeakFractionNeverExceedsTheMeasuredPeak) {
  // Against the best rate measured, large products at that rate and a small one at a quarter of
  // it: unconstrained, the curve's asymptote would sit above the best rate (a fraction over 1).
  const double peak = 1e12;
  auto at = [&](double m, double n, double k, double efficiency) {
    return GemmTiming{m, n, k, 2 * m * n * k / (peak * efficiency)};
  };
  const std::vector<GemmTiming> timings = {at(8192, 8192, 8192, 1.0), at(4096, 4096, 4096, 0.98),
                                           at(512, 512, 512, 0.25)};
  const GemmEfficiency fit = fit_gemm_efficiency(timings, peak);
  EXPECT_GT(fit.peak_fraction, 0);
  EXPECT_LE(fit.peak_fraction, 1.0);
  EXPECT_GT(fit.half_dim, 1);
}

TEST(PlanProfile, MeasuredGemmGridSetsEachShapesEfficiency) {
  // A grid of m in {100, 400}, n in {100, 200, 800}, k in {10, 40}, measured at efficiency
  // f(m) g(n) h(k): f = 0.5, 1; g = 0.4, 0.8, 1; h = 0.5, 1. Each point is timed twice (calibrate's
  // forward and backward) at half and 3/2 of the time its efficiency gives: their mean is that
  // time. Linear interpolation of the log of a product is the product of each axis's.
  const double peak = 1e11;
  auto f = [](double m) { return m == 100 ? 0.5 : 1.0; };
  auto g = [](double n) { return n == 100 ? 0.4 : n == 200 ? 0.8 : 1.0; };
  auto h = [](double k) { return k == 10 ? 0.5 : 1.0; };
  std::vector<GemmTiming> timings;
  for (double m : {100.0, 400.0})
    for (double n : {100.0, 200.0, 800.0})
      for (double k : {10.0, 40.0}) {
        const double seconds = 2 * m * n * k / (peak * f(m) * g(n) * h(k));
        timings.push_back({m, n, k, seconds / 2});
        timings.push_back({m, n, k, 1.5 * seconds});
      }
  GemmEfficiency e{0.9, 400};
  e.measured = gemm_grid(timings, peak);
  ASSERT_TRUE(e.measured);
  EXPECT_NEAR(e.efficiency(100, 200, 10), 0.5 * 0.8 * 0.5, 1e-12);
  EXPECT_NEAR(e.efficiency(400, 800, 10), 0.5, 1e-12);
  // At the logs' midpoints of m (200), of n's 200 and 800 (400) and of k (20):
  // sqrt(0.5) x sqrt(0.8) x sqrt(0.5) = sqrt(0.2).
  EXPECT_NEAR(e.efficiency(200, 400, 20), std::sqrt(0.2), 1e-12);
  // n = 150 lies log2(1.5) of the way from 100 to 200, where g doubles: 0.4 x 1.5 = 0.6.
  EXPECT_NEAR(e.efficiency(400, 150, 40), 0.6, 1e-12);
  // Outside the grid: the nearest point's efficiency times the curve's ratio. m = 50 against
  // 100: 0.5 x 0.4 x 0.5 x (50 / 450) / (100 / 500) = 1 / 18; k = 80 against 40:
  // 0.5 x 0.4 x 1 x (80 / 480) / (40 / 440) = 11 / 30; m = n = 800 against 400 and 800 at k = 40:
  // 1 x (800 / 1200) / (400 / 800) = 4 / 3, held at the peak (1).
  EXPECT_NEAR(e.efficiency(50, 100, 10), 1.0 / 18, 1e-12);
  EXPECT_NEAR(e.efficiency(100, 100, 80), 11.0 / 30, 1e-12);
  EXPECT_EQ(e.efficiency(800, 800, 40), 1.0);
  // Without the grid, the curve: 0.9 x (200 / 600) x (400 / 800) x (20 / 420).
  EXPECT_NEAR((GemmEfficiency{0.9, 400}).efficiency(200, 400, 20), 0.9 / 3 / 2 * 20 / 420, 1e-15);
  // A point missing (or a time not positive and finite) leaves no grid: the curve alone.
  std::vector<GemmTiming> holed(timings.begin() + 2, timings.end());
  EXPECT_FALSE(gemm_grid(holed, peak));
  const double first = timings[0].seconds;
  for (const double bad : {0.0, std::numeric_limits<double>::infinity()}) {
    timings[0].seconds = bad;
    EXPECT_FALSE(gemm_grid(timings, peak)) << bad;
  }
  timings[0].seconds = first;

  // A CPU profile's entry with such a grid prices its machine's GEMMs from it, one without from
  // the curve: `loom plan --profile` on the CPU engine.
  ProfileEntry entry = sample_entry(1);
  entry.peak_flops = peak;
  entry.gemm = {0.9, 400};
  EXPECT_FALSE(profiled_machine(entry, 1e9).job.gemm->measured);
  entry.gemm_timings = timings;
  const ProfiledMachine machine = profiled_machine(entry, 1e9);
  ASSERT_TRUE(machine.job.gemm->measured);
  EXPECT_NEAR(machine.job.gemm->efficiency(200, 400, 20), std::sqrt(0.2), 1e-12);
  // A GPU profile keeps the curve (machine_profile.cpp says why).
  EXPECT_FALSE(profiled_machine(entry, 1e9, Device::CUDA).job.gemm->measured);
}

TEST(PlanProfile, BadFilesNameTheField) {
  MachineProfile profile;
  profile.machine = "m";
  profile.entries.push_back(sample_entry(2));
  const std::string path = temp_path("bad.json");
  write_machine_profile(profile, path);
  std::ifstream in(path);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(path) << text;
    return path;
  };
  EXPECT_THROW_MSG(read_machine_profile(with("loom-machine-profile/1", "loom-machine-profile/9")), "format");
  EXPECT_THROW_MSG(read_machine_profile(with("\"memory_bytes_per_s\": 40000000000.0", "\"memory_bytes_per_s\": -1")),
                   "entries[0].memory_bytes_per_s: expected a positive, finite number");
  EXPECT_THROW_MSG(read_machine_profile(with("\"peak_flops\"", "\"peak_flop\"")), "entries[0]: missing \"peak_flops\"");
  EXPECT_THROW_MSG(read_machine_profile(with("\"op\": \"all_gather\"", "\"op\": \"all_gathr\"")),
                   "entries[0].collectives[1].op: \"all_gathr\" is not a collective");
  EXPECT_THROW_MSG(read_machine_profile(with("\"ranks\": 2", "\"ranks\": 3")), "does not divide the entry's 3 ranks");
  EXPECT_THROW_MSG(read_machine_profile(with("\"machine\": \"m\"", "\"machine\": \"m\", \"cores\": 0")),
                   "top level.cores: expected an integer >= 1, got 0");
  std::ofstream(path) << "{ not json";
  EXPECT_THROW_MSG(read_machine_profile(path), "is not JSON");
  std::filesystem::remove(path);
  EXPECT_THROW_MSG(read_machine_profile(path), "cannot be opened");
}

TEST(PlanProfile, MeasuredCollectivesReplaceTheLinkModels) {
  ClusterSpec cluster;
  cluster.gpus_per_node = 4;
  auto comm = std::make_shared<MeasuredComm>();
  comm->p2p = {4e-6, 1e10};
  comm->collectives.push_back({Collective::AllReduce, 2, {2e-5, 2e9}});
  cluster.measured_comm = comm;
  const GroupTopology pair = group_topology(cluster, 2, 1);
  // Measured: 20 us + 1 MB / 2 GB/s = 520 us.
  const CollectiveTime measured = collective_time(Collective::AllReduce, 1e6, pair);
  EXPECT_NEAR(measured.seconds, 2e-5 + 1e6 / 2e9, 1e-15);
  EXPECT_STREQ(measured.algorithm, "measured");
  EXPECT_DOUBLE_EQ(measured.wire_bytes_per_rank, 1e6);  // 2 (n - 1) / n of the buffer
  // No fit for 4 ranks: the ring over the measured send/recv link, 2 (n - 1) = 6 steps of
  // 4 us + (1 MB / 4) / 10 GB/s = 29 us each (the tree's 2 log2(4) x 4 us + 2 x 1 MB / 10 GB/s
  // = 216 us is slower).
  const CollectiveTime ring = collective_time(Collective::AllReduce, 1e6, group_topology(cluster, 4, 1));
  EXPECT_NEAR(ring.seconds, 6 * (4e-6 + 2.5e5 / 1e10), 1e-15);
  EXPECT_STREQ(ring.algorithm, "ring");
  // Pipeline messages take the measured send/recv link.
  EXPECT_NEAR(p2p_time(1e6, nvlink_of(cluster)), 4e-6 + 1e6 / 1e10, 1e-15);
}

TEST(PlanProfile, ProfiledMachineDataParallelReductionIsTheMeasuredAllReduce) {
  // GPT-2 with V = 64, T = 16, d = 32, 2 layers: 64 x 32 + 16 x 32 + 2 (12 x 32^2 + 13 x 32)
  // + 2 x 32 = 28,032 parameters (tied head), 112,128 bytes of f32 gradients; dp2 reduces them
  // in one all-reduce of 20 us + 112,128 B / 2 GB/s.
  ModelConfig model;
  model.arch = Architecture::GPT2;
  model.vocab_size = 64;
  model.max_seq_len = 16;
  model.n_layer = 2;
  model.n_embd = 32;
  model.n_head = 4;
  model.n_kv_head = 4;
  model.ffn_hidden = 128;
  ASSERT_EQ(model.parameter_count(), 28032);
  const ProfiledMachine m = profiled_machine(sample_entry(2), 1e9);
  EXPECT_EQ(m.cluster.gpus(), 2);
  EXPECT_EQ(m.cluster.gpu.bf16_tflops, 0.1);
  EXPECT_EQ(m.job.memory.activation_bytes, 4);
  TrainingJob job = m.job;
  job.seq_len = 16;
  job.memory.seq_len = 16;
  job.global_batch = 4;
  PlanLayout layout;
  layout.dp = 2;
  layout.micro_batch = 2;
  const StepTime t = predict_step_time(model, layout, m.cluster, job);
  EXPECT_NEAR(t.dp_comm_s, 2e-5 + 28032.0 * 4 / 2e9, 1e-12);
}

TEST(PlanProfile, MeasuredAttentionRatesSetTheCoreTime) {
  // Llama-style, d = 64, 4 heads of 16, seq 64, micro-batch 1: the core's forward FLOPs are
  // 2 matmuls x 2 x tokens x mean keys x d = 4 x 64 x 32 x 64 = 524,288 (flash: each query
  // meets seq / 2 keys). Only the attention efficiencies differ between the two jobs, so the
  // layer times differ by exactly the core's: forward 524,288 / (1e11 x e_f) and backward
  // 524,288 / (1e11 x e_b) against the fused-attention defaults (fused_attention_efficiency:
  // 0.25 x 32 keys / (32 + 256) x 16 / (16 + 24) for a GPU other than an A100, backward 2.5x the
  // forward's FLOPs), each measured efficiency 0.5 x prod d / (d + 32) over (64, 32, 16).
  ModelConfig model;
  model.arch = Architecture::Llama;
  model.vocab_size = 128;
  model.max_seq_len = 64;
  model.n_layer = 1;
  model.n_embd = 64;
  model.n_head = 4;
  model.n_kv_head = 4;
  model.ffn_hidden = 128;
  ProfiledMachine m = profiled_machine(sample_entry(1), 1e9);
  m.job.seq_len = 64;
  m.job.memory.seq_len = 64;
  m.job.global_batch = 1;
  PlanLayout layout;
  TrainingJob plain = m.job;
  plain.attention_forward.reset();
  plain.attention_backward.reset();
  const LayerTime with = predict_layer_time(model, layout, m.cluster, m.job);
  const LayerTime without = predict_layer_time(model, layout, m.cluster, plain);
  const double flops = 4.0 * 64 * 32 * 64;
  auto eff = [](double frac, double half) { return frac * (64 / (64 + half)) * (32 / (32 + half)) * (16 / (16 + half)); };
  const double fused_core = flops / (1e11 * 0.25 * (32.0 / 288) * (16.0 / 40));
  EXPECT_NEAR(with.forward_s - without.forward_s, flops / (1e11 * eff(0.5, 32)) - fused_core, 1e-12);
  EXPECT_NEAR(with.backward_s - without.backward_s, flops / (1e11 * eff(0.25, 32)) - 2.5 * fused_core, 1e-12);
}

}  // namespace
}  // namespace loom::plan
