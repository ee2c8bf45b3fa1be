// `loom calibrate --device cuda` (plan/cuda_calibration): the quick calibration of the CUDA
// engine on this GPU gives positive, finite rates and fits, a peak the efficiencies are
// fractions of, and a profile that round-trips and that `loom plan --profile` reads as a GPU.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/plan/cuda_calibration.hpp"
#include "loom/plan/machine_calibration.hpp"
#include "loom/plan/machine_profile.hpp"

namespace loom::cuda::test {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// One process alone: every collective over one rank is the identity (or a copy), so the
// calibration's barriers and reductions over ranks run without MPI.
class SoloGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  WorkHandle all_reduce(float*, int64_t, ReduceOp) override { return done(); }
  WorkHandle reduce_scatter(const float* in, float* out, int64_t count, ReduceOp) override {
    return copy(in, out, count);
  }
  WorkHandle all_gather(const float* in, float* out, int64_t count) override {
    return copy(in, out, count);
  }
  WorkHandle broadcast(float*, int64_t, int) override { return done(); }
  WorkHandle all_to_all(const float* in, float* out, int64_t count) override {
    return copy(in, out, count);
  }
  WorkHandle all_to_allv(const float* in, const std::vector<int64_t>& send_counts, float* out,
                         const std::vector<int64_t>&) override {
    return copy(in, out, send_counts.at(0));
  }
  WorkHandle send(const float*, int64_t, int, int) override {
    throw_error("SoloGroup: no peer to send to");
  }
  WorkHandle recv(float*, int64_t, int, int) override {
    throw_error("SoloGroup: no peer to receive from");
  }
  void barrier() override {}
  std::shared_ptr<ProcessGroup> split(int, int, std::string) override {
    return std::make_shared<SoloGroup>();
  }
  void set_timeout_seconds(double) override {}
  double timeout_seconds() const override { return 0; }

 private:
  static WorkHandle done() { return std::make_shared<DoneWork>(); }
  static WorkHandle copy(const float* in, float* out, int64_t count) {
    std::copy(in, in + count, out);
    return done();
  }
  std::string name_ = "solo";
};

bool positive_finite(double x) { return std::isfinite(x) && x > 0; }

void expect_fit(const plan::GemmEfficiency& fit, const char* what) {
  EXPECT_TRUE(positive_finite(fit.peak_fraction)) << what << ": " << fit.peak_fraction;
  EXPECT_LE(fit.peak_fraction, 1.0) << what;
  EXPECT_TRUE(std::isfinite(fit.half_dim) && fit.half_dim >= 1) << what << ": " << fit.half_dim;
}

void expect_timings(const std::vector<plan::GemmTiming>& timings, size_t count, const char* what) {
  EXPECT_EQ(timings.size(), count) << what;
  for (const plan::GemmTiming& t : timings) EXPECT_TRUE(positive_finite(t.seconds)) << what;
}

using CudaCalibration = CudaTest;

TEST_F(CudaCalibration, QuickProfileHasPositiveFiniteRatesAndFits) {
  ASSERT_GE(device_memory::select_cuda_device(0), 0);
  SoloGroup world;
  plan::CalibrationOptions options;
  options.quick = true;
  options.device = Device::CUDA;
  const plan::ProfileEntry entry = plan::calibrate_machine(world, options);
  EXPECT_EQ(entry.ranks, 1);
  EXPECT_EQ(entry.threads_per_rank, 1);
  // The peak is the best GEMM rate measured: somewhere between a toy GPU and a B300's FP8.
  EXPECT_TRUE(positive_finite(entry.peak_flops));
  EXPECT_GT(entry.peak_flops, 1e12);
  EXPECT_LT(entry.peak_flops, 1e16);
  expect_fit(entry.gemm, "gemm");
  expect_fit(entry.attention_forward, "attention_forward");
  expect_fit(entry.attention_backward, "attention_backward");
  expect_timings(entry.gemm_timings, 16, "gemm_timings");  // 8 quick shapes, forward and backward
  expect_timings(entry.attention_forward_timings, 2, "attention_forward_timings");
  expect_timings(entry.attention_backward_timings, 2, "attention_backward_timings");
  // No timing is faster than the peak allows (the peak is the best of them).
  for (const plan::GemmTiming& t : entry.gemm_timings)
    EXPECT_LE(2 * t.m * t.n * t.k / t.seconds, entry.peak_flops * (1 + 1e-9));
  // Streaming bf16 activations: more than a PCIe link, less than any HBM's 20 TB/s.
  EXPECT_TRUE(positive_finite(entry.memory_bytes_per_s));
  EXPECT_GT(entry.memory_bytes_per_s, 5e10);
  EXPECT_LT(entry.memory_bytes_per_s, 2e13);
  EXPECT_FALSE(entry.comm);  // one rank: nothing to communicate

  // The profile `loom calibrate --device cuda` writes from it, read back as the planner reads it.
  const plan::CudaMachine gpu = plan::describe_cuda_machine(0);
  EXPECT_FALSE(gpu.name.empty());
  EXPECT_GE(gpu.gpus, 1);
  EXPECT_GT(gpu.memory_bytes, 0);
  plan::MachineProfile profile;
  profile.machine = gpu.name;
  profile.device = Device::CUDA;
  profile.cores = gpu.gpus;
  profile.gpu_memory_bytes = gpu.memory_bytes;
  plan::merge_profile_entry(profile, entry);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("loom_gpu_profile_" + std::to_string(::getpid()) + ".json"))
                               .string();
  plan::write_machine_profile(profile, path);
  const plan::MachineProfile read = plan::read_machine_profile(path);
  std::filesystem::remove(path);
  EXPECT_EQ(read.machine, gpu.name);
  EXPECT_EQ(read.device, Device::CUDA);
  EXPECT_EQ(read.entry(1).peak_flops, entry.peak_flops);
  const plan::ProfiledMachine m =
      plan::profiled_machine(read, 1, plan::memory_bytes_per_rank(read, 1, 0));
  EXPECT_EQ(m.cluster.gpu.hbm_bytes, static_cast<double>(gpu.memory_bytes));
  EXPECT_EQ(m.job.memory.activation_bytes, 2);
}

}  // namespace
}  // namespace loom::cuda::test
