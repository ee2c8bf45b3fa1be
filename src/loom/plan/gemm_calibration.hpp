#pragma once
// Replacing the default GEMM efficiency table by measurements: a file of timed matrix products
// on the target GPU is fitted to the time model's efficiency curve, so `loom plan` predicts
// with what this machine and library actually sustain.
#include <memory>
#include <string>
#include <vector>

#include "loom/plan/time_model.hpp"

namespace loom::plan {

// GemmTiming (one timed product) is in time_model.hpp, where the time model reads them too.

// CSV with the header "m,n,k,seconds" and one timing per line ('#' starts a comment). Throws
// loom::Error naming the line for a malformed or non-positive value.
std::vector<GemmTiming> read_gemm_timings(const std::string& path);

// The GemmEfficiency whose curve fits the timings best in log space (relative errors weigh
// the same for small and large products): half_dim by a log-spaced scan from 1 to 8192, the
// peak fraction in closed form for each, at most 1 (no shape beats the peak). Needs two timings
// of different shapes at least; `peak_flops` is the peak the fractions are relative to: the
// GPU's dense datasheet peak, or (a machine profile) the best rate measured.
GemmEfficiency fit_gemm_efficiency(const std::vector<GemmTiming>& timings, double peak_flops);

// The timings as a grid of measured efficiencies (GemmGrid), relative to `peak_flops`; null
// unless they time every (m, n, k) of their sizes and every time is positive.
std::shared_ptr<const GemmGrid> gemm_grid(const std::vector<GemmTiming>& timings,
                                          double peak_flops);

// The efficiency timings measured at (tokens, keys, head_dim): those at head_dim, each
// 2 m n k / (seconds x peak), log-linear in n between the two around keys (the nearest beyond
// them), times fit's ratio between the tokens asked and those measured; fit alone where none was
// measured at head_dim.
double measured_efficiency(const std::vector<GemmTiming>& timings, const GemmEfficiency& fit,
                           double peak, double tokens, double keys, double head_dim);

}  // namespace loom::plan
