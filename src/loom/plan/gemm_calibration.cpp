#include "loom/plan/gemm_calibration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"

namespace loom::plan {

std::vector<GemmTiming> read_gemm_timings(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error("GEMM timings: cannot open '", path, "'");
  std::vector<GemmTiming> out;
  std::string line;
  bool header_seen = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!header_seen) {
      std::string compact;
      for (char c : line)
        if (c != ' ' && c != '\t' && c != '\r') compact += c;
      if (compact != "m,n,k,seconds")
        throw_error("GEMM timings '", path, "' line ", number, ": expected the header m,n,k,seconds, got '", line, "'");
      header_seen = true;
      continue;
    }
    std::istringstream fields(line);
    double values[4];
    for (int i = 0; i < 4; ++i) {
      std::string field;
      std::getline(fields, field, ',');
      char* end = nullptr;
      values[i] = std::strtod(field.c_str(), &end);
      const bool blank_tail = end != nullptr && std::string(end).find_first_not_of(" \t\r") == std::string::npos;
      if (field.empty() || !blank_tail || !(values[i] > 0) || !std::isfinite(values[i]))
        throw_error("GEMM timings '", path, "' line ", number, ": field ", i + 1, " ('", field,
                    "') is not a positive number");
    }
    out.push_back({values[0], values[1], values[2], values[3]});
  }
  if (!header_seen) throw_error("GEMM timings '", path, "' is empty; expected the header m,n,k,seconds");
  return out;
}

GemmEfficiency fit_gemm_efficiency(const std::vector<GemmTiming>& timings, double peak_flops) {
  if (timings.size() < 2) throw_error("GEMM calibration needs at least two timings, got ", timings.size());
  if (!(peak_flops > 0)) throw_error("GEMM calibration: peak FLOP/s must be positive, got ", peak_flops);
  std::vector<double> log_observed;
  for (const GemmTiming& t : timings) {
    if (!(t.m > 0 && t.n > 0 && t.k > 0 && t.seconds > 0))
      throw_error("GEMM calibration: a timing has a non-positive dimension or time");
    log_observed.push_back(std::log(2 * t.m * t.n * t.k / (t.seconds * peak_flops)));
  }
  GemmEfficiency best;
  double best_residual = std::numeric_limits<double>::infinity();
  for (int step = 0; step <= 260; ++step) {
    const double half_dim = std::pow(2.0, step / 20.0);  // 1 .. 8192, 20 steps per octave
    std::vector<double> log_shape;
    double mean = 0;
    for (size_t i = 0; i < timings.size(); ++i) {
      const GemmTiming& t = timings[i];
      log_shape.push_back(std::log(t.m / (t.m + half_dim)) + std::log(t.n / (t.n + half_dim)) +
                          std::log(t.k / (t.k + half_dim)));
      mean += log_observed[i] - log_shape.back();
    }
    mean /= static_cast<double>(timings.size());  // log of the best peak fraction for this half_dim
    // No shape runs faster than the peak: the fraction is at most 1 (log 0). With the peak the
    // best rate measured (`loom calibrate`), the unconstrained fit can put the curve's asymptote
    // above every measurement; the residual is a parabola in `mean`, so the bound is the
    // constrained optimum and half_dim is then chosen with it.
    mean = std::min(mean, 0.0);
    double residual = 0;
    for (size_t i = 0; i < timings.size(); ++i) residual += std::pow(log_observed[i] - log_shape[i] - mean, 2);
    if (residual < best_residual) {
      best_residual = residual;
      best = {std::exp(mean), half_dim};
    }
  }
  return best;
}

std::shared_ptr<const GemmGrid> gemm_grid(const std::vector<GemmTiming>& timings,
                                          double peak_flops) {
  if (timings.empty() || !(peak_flops > 0)) return nullptr;
  auto grid = std::make_shared<GemmGrid>();
  for (const GemmTiming& t : timings) {
    if (!(t.m > 0 && t.n > 0 && t.k > 0 && t.seconds > 0 && std::isfinite(t.seconds)))
      return nullptr;
    grid->m.push_back(t.m), grid->n.push_back(t.n), grid->k.push_back(t.k);
  }
  for (std::vector<double>* axis : {&grid->m, &grid->n, &grid->k}) {
    std::sort(axis->begin(), axis->end());
    axis->erase(std::unique(axis->begin(), axis->end()), axis->end());
  }
  const size_t nm = grid->m.size(), nn = grid->n.size(), nk = grid->k.size();
  auto index = [&](const std::vector<double>& axis, double v) {
    return static_cast<size_t>(std::lower_bound(axis.begin(), axis.end(), v) - axis.begin());
  };
  std::vector<double> seconds(nm * nn * nk, 0.0), count(seconds.size(), 0.0);
  for (const GemmTiming& t : timings) {
    const size_t i = (index(grid->m, t.m) * nn + index(grid->n, t.n)) * nk + index(grid->k, t.k);
    seconds[i] += t.seconds, count[i] += 1;
  }
  grid->log_efficiency.resize(seconds.size());
  for (size_t a = 0; a < nm; ++a)
    for (size_t b = 0; b < nn; ++b)
      for (size_t c = 0; c < nk; ++c) {
        const size_t i = (a * nn + b) * nk + c;
        if (count[i] == 0) return nullptr;  // not a full grid: the curve alone
        grid->log_efficiency[i] = std::log(2 * grid->m[a] * grid->n[b] * grid->k[c] /
                                           (seconds[i] / count[i] * peak_flops));
      }
  return grid;
}

double GemmGrid::at(double mq, double nq, double kq) const {
  // On each axis the two sizes around the query and the query's weight between them in log
  // size (one size: weight 0).
  struct Bracket {
    size_t lo, hi;
    double w;
  };
  auto bracket = [](const std::vector<double>& axis, double v) {
    if (axis.size() == 1 || v <= axis.front()) return Bracket{0, 0, 0.0};
    if (v >= axis.back()) return Bracket{axis.size() - 1, axis.size() - 1, 0.0};
    size_t hi = 1;
    while (axis[hi] < v) ++hi;
    return Bracket{hi - 1, hi, std::log(v / axis[hi - 1]) / std::log(axis[hi] / axis[hi - 1])};
  };
  const Bracket bm = bracket(m, mq), bn = bracket(n, nq), bk = bracket(k, kq);
  double out = 0;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 2; ++c) {
        const double w = (a ? bm.w : 1 - bm.w) * (b ? bn.w : 1 - bn.w) * (c ? bk.w : 1 - bk.w);
        if (w == 0) continue;
        const size_t i =
            ((a ? bm.hi : bm.lo) * n.size() + (b ? bn.hi : bn.lo)) * k.size() + (c ? bk.hi : bk.lo);
        out += w * log_efficiency[i];
      }
  return out;
}

// The efficiency the timings measured at (tokens, keys, head_dim): those at head_dim, each
// 2 m n k / (seconds x peak), log-linear in n between the two around keys (the nearest beyond
// them), times fit's ratio between the tokens asked and the ones measured; fit alone when none
// was measured at head_dim.
double measured_efficiency(const std::vector<GemmTiming>& timings, const GemmEfficiency& fit,
                           double peak, double tokens, double keys, double head_dim) {
  std::vector<const GemmTiming*> at;
  for (const GemmTiming& t : timings)
    if (t.k == head_dim && t.seconds > 0) at.push_back(&t);
  if (at.empty()) return fit.efficiency(tokens, keys, head_dim);
  std::sort(at.begin(), at.end(),
            [](const GemmTiming* a, const GemmTiming* b) { return a->n < b->n; });
  auto eff = [&](const GemmTiming* t) {
    return 2 * t->m * t->n * t->k / (t->seconds * peak) * fit.efficiency(tokens, t->n, head_dim) /
           fit.efficiency(t->m, t->n, head_dim);
  };
  if (keys <= at.front()->n) return eff(at.front());
  if (keys >= at.back()->n) return eff(at.back());
  size_t hi = 1;
  while (at[hi]->n < keys) ++hi;
  const GemmTiming *a = at[hi - 1], *b = at[hi];
  const double w = std::log(keys / a->n) / std::log(b->n / a->n);
  return eff(a) * (1 - w) + eff(b) * w;
}

}  // namespace loom::plan
