// Planner hardware presets and cluster model: datasheet numbers as printed, power and failure
// rates hand-computed for a Llama-3-sized job, Young/Daly intervals at points from Daly's
// paper, goodput moving the right way, 200,000 GPUs staying finite, and errors that name
// the field or argument at fault.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "loom/plan/cluster_model.hpp"
#include "loom/plan/hardware.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using plan::ClusterEstimate;
using plan::ClusterSpec;
using plan::estimate_cluster;
using plan::gpu_preset;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A Llama-3-405B-like job: 16,384 H100s in 2,048 nodes, 16M-token steps of 10 s, 15.6T tokens
// (975,000 steps = 2,708.33 h ideal), a 10 TB checkpoint (5 s at the default 2 TB/s).
ClusterSpec llama3_cluster() {
  ClusterSpec cluster;
  cluster.nodes = 2048;
  return cluster;
}
constexpr double kStepSeconds = 10;
constexpr double kTokensPerStep = 16e6;
constexpr double kTokensToTrain = 15.6e12;
constexpr double kCheckpointBytes = 10e12;

ClusterEstimate estimate(const ClusterSpec& cluster, double power_fraction = 1.0) {
  return estimate_cluster(cluster, kStepSeconds, kTokensPerStep, kTokensToTrain, kCheckpointBytes,
                          power_fraction);
}

TEST(GpuPresets, MatchDatasheetsHalvedForSparsity) {
  const plan::GpuSpec& h100 = gpu_preset("h100-sxm");
  EXPECT_EQ(h100.name, "h100-sxm");
  EXPECT_DOUBLE_EQ(h100.bf16_tflops, 989.5);  // 1,979 sparse / 2
  EXPECT_DOUBLE_EQ(h100.fp8_tflops, 1979);
  EXPECT_DOUBLE_EQ(h100.hbm_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.nvlink_bytes_per_s, 450e9);  // 900 GB/s both directions
  EXPECT_DOUBLE_EQ(h100.tdp_watts, 700);

  const plan::GpuSpec& a100 = gpu_preset("a100-40gb");
  EXPECT_DOUBLE_EQ(a100.bf16_tflops, 312);
  EXPECT_EQ(a100.fp8_tflops, 0) << "Ampere has no FP8";
  EXPECT_DOUBLE_EQ(a100.nvlink_bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(gpu_preset("a100-80gb").hbm_bandwidth_bytes_per_s, 2039e9);

  const plan::GpuSpec& h200 = gpu_preset("h200");
  EXPECT_DOUBLE_EQ(h200.bf16_tflops, h100.bf16_tflops);
  EXPECT_DOUBLE_EQ(h200.hbm_bytes, 141 * kGiB);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth_bytes_per_s, 4.8e12);

  const plan::GpuSpec& b200 = gpu_preset("b200");
  EXPECT_DOUBLE_EQ(b200.bf16_tflops, 2250);
  EXPECT_DOUBLE_EQ(b200.fp8_tflops, 4500);
  EXPECT_DOUBLE_EQ(b200.nvlink_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(b200.tdp_watts, 1000);
  const plan::GpuSpec& b300 = gpu_preset("b300");
  EXPECT_DOUBLE_EQ(b300.fp8_tflops, 4500);      // DGX B300: 72 PF sparse FP8 per 8 GPUs
  EXPECT_DOUBLE_EQ(b300.hbm_bytes, 288 * kGiB);  // 2.3 TB per 8
  EXPECT_DOUBLE_EQ(gpu_preset("h100-pcie").bf16_tflops, 756.5);  // 1,513 sparse / 2
  EXPECT_DOUBLE_EQ(gpu_preset("h100-nvl").hbm_bytes, 94 * kGiB);
  EXPECT_DOUBLE_EQ(gpu_preset("a800-80gb").nvlink_bytes_per_s, 200e9);  // 400 GB/s both ways
  EXPECT_TRUE(plan::ampere_part(gpu_preset("a800-80gb")));
  EXPECT_FALSE(plan::ampere_part(h100));
  const plan::GpuSpec& gb200 = gpu_preset("gb200");
  EXPECT_DOUBLE_EQ(gb200.bf16_tflops, 2500);  // NVL72: 360 PF sparse per 72
  EXPECT_DOUBLE_EQ(gb200.fp8_tflops, 5000);
  EXPECT_DOUBLE_EQ(gb200.hbm_bytes, 186 * kGiB);

  // AMD Instinct datasheets: MI300X BF16 1,307.4 and FP8 2,614.9 TF dense, 192 GB at 5.3 TB/s,
  // Infinity Fabric 896 GB/s both ways; an MI250X GCD half the package's 383 TF, 128 GB, 3.2 TB/s.
  const plan::GpuSpec& mi300x = gpu_preset("mi300x");
  EXPECT_DOUBLE_EQ(mi300x.bf16_tflops, 1307.4);
  EXPECT_DOUBLE_EQ(mi300x.fp8_tflops, 2614.9);
  EXPECT_DOUBLE_EQ(mi300x.hbm_bytes, 192 * kGiB);
  EXPECT_DOUBLE_EQ(mi300x.nvlink_bytes_per_s, 448e9);
  EXPECT_DOUBLE_EQ(mi300x.fp4_tflops, 0);  // CDNA 3: no 4-bit or block-scaled tensor cores
  EXPECT_FALSE(mi300x.nvls);
  EXPECT_TRUE(plan::amd_part(mi300x));
  EXPECT_FALSE(plan::amd_part(h100));
  const plan::GpuSpec& mi250x = gpu_preset("mi250x");
  EXPECT_DOUBLE_EQ(mi250x.bf16_tflops, 191.5);
  EXPECT_DOUBLE_EQ(mi250x.hbm_bytes, 64 * kGiB);
  EXPECT_DOUBLE_EQ(mi250x.hbm_bandwidth_bytes_per_s, 1.6e12);
  EXPECT_DOUBLE_EQ(mi250x.fp8_tflops, 0);
  EXPECT_DOUBLE_EQ(gpu_preset("mi355x").fp4_tflops, 10000);
  // A GH200 is an H100's tensor cores with 96 GB of HBM3 at 4 TB/s; the H20 a cut Hopper.
  EXPECT_DOUBLE_EQ(gpu_preset("gh200").bf16_tflops, h100.bf16_tflops);
  EXPECT_DOUBLE_EQ(gpu_preset("gh200").hbm_bytes, 96 * kGiB);
  EXPECT_DOUBLE_EQ(gpu_preset("gh200-144gb").hbm_bandwidth_bytes_per_s, 4.9e12);
  EXPECT_DOUBLE_EQ(gpu_preset("h20").bf16_tflops, 148);
  EXPECT_DOUBLE_EQ(gpu_preset("v100-16gb").hbm_bytes, 16 * kGiB);

  EXPECT_EQ(&gpu_preset("H100-SXM"), &h100) << "names match case-insensitively";
  EXPECT_EQ(plan::gpu_preset_names(),
            (std::vector<std::string>{"v100-32gb", "v100-16gb", "a100-40gb", "a100-80gb", "h100-sxm", "h800-sxm",
                                      "h100-pcie", "h100-nvl", "a800-80gb", "h200", "gh200", "gh200-144gb", "h20", "b200",
                                      "b300", "gb200", "gb300", "mi250x", "mi250", "mi300x", "mi325x", "mi350x",
                                      "mi355x"}));
}

TEST(GpuPresets, UnknownNameListsValidOnes) {
  const std::string message = error_message([] { gpu_preset("tpu-v5p"); });
  expect_contains(message, {"'tpu-v5p'", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x"});
}

TEST(ClusterSpec, DefaultsReproduceLlama3FailureRate) {
  const ClusterSpec cluster;
  EXPECT_NO_THROW(cluster.validate());
  EXPECT_EQ(cluster.gpu.name, "h100-sxm");
  EXPECT_NEAR(cluster.gpu_mtbf_hours, 86332.2, 0.1);    // 16,384 x 1,296 h / (0.587 x 419)
  EXPECT_NEAR(cluster.node_mtbf_hours, 15338.1, 0.1);   // 2,048 x 1,296 h / (0.413 x 419)
  EXPECT_DOUBLE_EQ(cluster.node_overhead_watts, 4600);  // DGX H100 10.2 kW - 8 x 700 W
  // The source job on the default cluster gets back the source's 419 interruptions / 54 days.
  EXPECT_NEAR(estimate(llama3_cluster()).failures_per_day, 419.0 / 54, 1e-9);
}

TEST(ClusterModel, PowerEnergyAndTimeFor16kH100) {
  ClusterSpec cluster = llama3_cluster();
  cluster.price_per_gpu_hour = 2;
  const ClusterEstimate full = estimate(cluster);
  // 16,384 x 700 W = 11.4688 MW of GPUs + 2,048 x 4.6 kW = 9.4208 MW of nodes; x 1.2 PUE.
  EXPECT_NEAR(full.it_power_mw, 20.8896, 1e-9);
  EXPECT_NEAR(full.power_mw, 25.06752, 1e-9);
  // At 75% of TDP only the GPU term shrinks: 8.6016 + 9.4208 = 18.0224 MW IT.
  const ClusterEstimate partial = estimate(cluster, 0.75);
  EXPECT_NEAR(partial.it_power_mw, 18.0224, 1e-9);
  EXPECT_NEAR(partial.power_mw, 21.62688, 1e-9);

  EXPECT_NEAR(full.mtbf_hours, 54.0 * 24 / 419, 1e-9);
  EXPECT_DOUBLE_EQ(full.checkpoint_write_s, 5);  // 10 TB / 2 TB/s
  const double mtbf_s = full.mtbf_hours * 3600;
  EXPECT_DOUBLE_EQ(full.checkpoint_interval_s, plan::daly_checkpoint_interval_s(5, mtbf_s));
  EXPECT_DOUBLE_EQ(full.goodput,
                   plan::checkpoint_goodput(full.checkpoint_interval_s, 5, 600, mtbf_s));
  // By hand: M = 11,135.08 s, tau = sqrt(2 x 5 x M) (1 + sqrt(xi)/3 + xi/9) - 5 = 330.368 s,
  // goodput = tau / (M e^{600/M} (e^{(tau + 5)/M} - 1)) = 0.919430. Restarts dominate the loss.
  EXPECT_NEAR(full.checkpoint_interval_s, 330.368, 1e-3);
  EXPECT_NEAR(full.goodput, 0.919430, 1e-6);

  const double ideal_hours = 975000.0 * 10 / 3600;
  EXPECT_NEAR(full.wall_time_hours, ideal_hours / full.goodput, 1e-9);
  EXPECT_NEAR(full.gpu_hours, 16384 * full.wall_time_hours, 1e-6);
  EXPECT_NEAR(full.energy_mwh, 25.06752 * full.wall_time_hours, 1e-6);
  EXPECT_NEAR(full.cost, 2 * full.gpu_hours, 1e-6);
  cluster.price_per_gpu_hour = 0;
  EXPECT_EQ(estimate(cluster).cost, 0) << "unpriced";
}

TEST(CheckpointInterval, YoungIsDalysLimitWhenWritesAreShort) {
  // delta = 1 s, M = 1e6 s: Daly's correction is (1/3) sqrt(5e-7) - delta/tau ~ -4.7e-4.
  const double young = plan::young_checkpoint_interval_s(1, 1e6);
  EXPECT_DOUBLE_EQ(young, std::sqrt(2e6));
  const double daly = plan::daly_checkpoint_interval_s(1, 1e6);
  EXPECT_NEAR(daly / young, 1.0, 1e-3);
  EXPECT_LT(daly, young);
}

TEST(CheckpointInterval, DalyMatchesHisPublishedExamples) {
  // Daly 2006 Fig. 4: M = 6 h, delta = 5 min. xi = delta/2M = 1/144, sqrt(2 delta M) = 60 min:
  // 60 (1 + 1/36 + 1/1296) - 5 = 56.712963 min; the paper prints "tau_opt = 57 min".
  EXPECT_NEAR(plan::daly_checkpoint_interval_s(300, 21600), 3402.7777778, 1e-6);
  // Fig. 3: M = 24 h, delta = 5 min: 120 (1 + 1/72 + 1/5184) - 5 = 116.69 min ("117 min").
  EXPECT_NEAR(plan::daly_checkpoint_interval_s(300, 86400), 7001.3888889, 1e-6);
  // Beyond delta >= 2M Daly checkpoints once per MTBF.
  EXPECT_DOUBLE_EQ(plan::daly_checkpoint_interval_s(100, 40), 40);
}

TEST(CheckpointGoodput, ExactPoissonFormAndItsFirstOrderLimit) {
  // tau = 1000, delta = 100, R = 0, M = 10,000: 1000 / (10,000 (e^0.11 - 1)).
  EXPECT_NEAR(plan::checkpoint_goodput(1000, 100, 0, 10000), 0.8600073909, 1e-9);
  // A restart of 600 s multiplies wall time by e^{R/M} = e^0.06.
  EXPECT_NEAR(plan::checkpoint_goodput(1000, 100, 600, 10000), 0.8099244594, 1e-9);
  // With everything << M it is 1/(1 + delta/tau) (1 - (R + (tau + delta)/2)/M) = 0.98953960.
  EXPECT_NEAR(plan::checkpoint_goodput(1000, 10, 60, 1e6), 0.9895396040, 1e-6);
}

TEST(ClusterModel, GoodputFallsWithMoreFailuresAndSlowerCheckpoints) {
  const ClusterEstimate base = estimate(llama3_cluster());

  ClusterSpec flaky = llama3_cluster();
  flaky.gpu_mtbf_hours /= 4;
  const ClusterEstimate more_failures = estimate(flaky);
  EXPECT_GT(more_failures.failures_per_day, base.failures_per_day);
  EXPECT_LT(more_failures.checkpoint_interval_s, base.checkpoint_interval_s);
  EXPECT_LT(more_failures.goodput, base.goodput);
  EXPECT_GT(more_failures.wall_time_hours, base.wall_time_hours);

  ClusterSpec slow_storage = llama3_cluster();
  slow_storage.storage_write_bytes_per_s /= 100;  // 500 s per checkpoint
  const ClusterEstimate slower = estimate(slow_storage);
  EXPECT_DOUBLE_EQ(slower.checkpoint_write_s, 500);
  EXPECT_GT(slower.checkpoint_interval_s, base.checkpoint_interval_s);
  EXPECT_LT(slower.goodput, base.goodput);
  EXPECT_GT(slower.energy_mwh, base.energy_mwh);
}

TEST(ClusterModel, TwoHundredThousandGpusStayFinite) {
  ClusterSpec cluster;
  cluster.nodes = 25000;
  const ClusterEstimate big = estimate(cluster);
  // 200,000 x 700 W + 25,000 x 4.6 kW = 140 + 115 MW IT; x 1.2.
  EXPECT_NEAR(big.it_power_mw, 255, 1e-9);
  EXPECT_NEAR(big.power_mw, 306, 1e-9);
  // Both GPU and node counts scale by 200,000 / 16,384 from the Llama 3 job.
  EXPECT_NEAR(big.failures_per_day, 419.0 / 54 * 200000 / 16384, 1e-9);
  for (double value : {big.energy_mwh, big.mtbf_hours, big.checkpoint_interval_s,
                       big.wall_time_hours, big.gpu_hours})
    EXPECT_TRUE(std::isfinite(value) && value > 0) << value;
  EXPECT_GT(big.goodput, 0);
  EXPECT_LT(big.goodput, estimate(llama3_cluster()).goodput);

  // A job that restarts slower than it fails never finishes: goodput 0, time infinite, no NaN.
  cluster.restart_seconds = 1e7;
  const ClusterEstimate stuck = estimate(cluster);
  EXPECT_EQ(stuck.goodput, 0);
  EXPECT_TRUE(std::isinf(stuck.wall_time_hours));
}

TEST(ClusterSpec, ValidationNamesTheField) {
  ClusterSpec bad_pue;
  bad_pue.pue = 0.5;
  expect_contains(error_message([&] { bad_pue.validate(); }), {"pue", "0.5"});

  ClusterSpec no_gpus;
  no_gpus.gpus_per_node = 0;
  expect_contains(error_message([&] { no_gpus.validate(); }), {"gpus_per_node", "0"});

  ClusterSpec bad_tdp;
  bad_tdp.gpu.tdp_watts = -1;
  expect_contains(error_message([&] { bad_tdp.validate(); }), {"gpu.tdp_watts", "-1"});

  ClusterSpec nan_storage;
  nan_storage.storage_write_bytes_per_s = std::nan("");
  expect_contains(error_message([&] { nan_storage.validate(); }), {"storage_write_bytes_per_s"});

  ClusterSpec bad_mtbf;
  bad_mtbf.node_mtbf_hours = 0;
  expect_contains(error_message([&] { estimate(bad_mtbf); }), {"node_mtbf_hours"});
}

TEST(ClusterModel, RejectsBadArgumentsByName) {
  const ClusterSpec cluster;
  expect_contains(error_message([&] { estimate_cluster(cluster, 0, 1, 1, 1); }),
                  {"step_seconds", "0"});
  expect_contains(error_message([&] { estimate_cluster(cluster, 1, -5, 1, 1); }),
                  {"tokens_per_step", "-5"});
  expect_contains(error_message([&] { estimate_cluster(cluster, 1, 1, 0, 1); }),
                  {"tokens_to_train"});
  expect_contains(error_message([&] { estimate_cluster(cluster, 1, 1, 1, 0); }),
                  {"checkpoint_bytes"});
  expect_contains(error_message([&] { estimate_cluster(cluster, 1, 1, 1, 1, 1.5); }),
                  {"gpu_utilisation_power_fraction", "1.5"});
}

}  // namespace
}  // namespace loom::test
