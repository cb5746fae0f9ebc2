#include "kernels/cpu/policy_loss.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace l3::kernels::cpu {

namespace {

bool fits(std::span<const float> x, std::size_t count) { return x.empty() || x.size() == count; }

// The importance-sampling ratio rho of every row (1 when off) and its statistics: one unit per
// row (token_*) or per completion (sequence_*), as kernels/ops.hpp's PolicyLossArgs says.
std::vector<double> importance_ratios(const PolicyRows& rows, const PolicyParams& params,
                                      PolicyStats& stats) {
  const std::size_t count = rows.row_loss.size();
  std::vector<double> rho(count, 1.0);
  const ImportanceSampling mode = params.importance_sampling;
  if (mode == ImportanceSampling::off) return rho;
  if (rows.sampled_logps.size() != count)
    throw core::internal_error("policy_loss: importance sampling without sampled_logps");
  // old - sampled of row c, old being the current log-probability when not given
  const auto difference = [&](std::size_t c) {
    const double old = rows.old_logps.empty() ? -static_cast<double>(rows.row_loss[c])
                                              : static_cast<double>(rows.old_logps[c]);
    return old - static_cast<double>(rows.sampled_logps[c]);
  };
  // Corrects one unit's raw ratio and counts it, its `rows` rows rejected when out of bounds.
  const auto correct = [&](double raw, std::size_t unit_rows) {
    const bool outside = raw < params.clip_min || raw > params.clip_max;
    double r = raw;
    if (is_masking(mode)) {
      if (outside) r = 0.0;
    } else {
      r = std::min(std::max(raw, params.clip_min), params.clip_max);
    }
    if (outside) stats.rejected += static_cast<std::int64_t>(unit_rows);
    stats.ratio_sum += r;
    ++stats.ratio_units;
    stats.ratio_max = std::max(stats.ratio_max, r);
    stats.ratio_min = std::min(stats.ratio_min, r);
    return r;
  };
  if (!is_sequence_level(mode)) {
    for (std::size_t c = 0; c < count; ++c) rho[c] = correct(std::exp(difference(c)), 1);
    return rho;
  }
  const std::span<const std::int32_t> starts = rows.completion_starts;
  if (count == 0 && starts.empty()) return rho;  // a pass of no rows: nothing to count
  if (starts.empty() || starts.front() != 0 || std::cmp_not_equal(starts.back(), count) ||
      !std::is_sorted(starts.begin(), starts.end())) {
    throw core::internal_error(
        "policy_loss: sequence-level importance sampling needs completion_starts 0 .. C");
  }
  for (std::size_t k = 0; k + 1 < starts.size(); ++k) {
    const auto begin = static_cast<std::size_t>(starts[k]);
    const auto end = static_cast<std::size_t>(starts[k + 1]);
    double sum = 0.0;
    for (std::size_t c = begin; c < end; ++c) sum += difference(c);
    const double r = correct(std::exp(sum), end - begin);
    std::fill(rho.begin() + static_cast<std::ptrdiff_t>(begin),
              rho.begin() + static_cast<std::ptrdiff_t>(end), r);
  }
  return rho;
}

}  // namespace

PolicyStats policy_loss(const PolicyRows& rows, const PolicyParams& params,
                        std::span<float> d_rows) {
  const std::size_t count = rows.row_loss.size();
  if (rows.advantages.size() != count || rows.weights.size() != count ||
      !fits(rows.old_logps, count) || !fits(rows.ref_row_loss, count) ||
      !fits(rows.sampled_logps, count) || !fits(rows.row_entropy, count) ||
      (!d_rows.empty() && d_rows.size() != count)) {
    throw core::internal_error("policy_loss: arrays of different lengths");
  }
  const double low_bound = 1.0 - params.epsilon_low;
  const double high_bound = 1.0 + params.epsilon_high;
  PolicyStats stats;
  const std::vector<double> rho = importance_ratios(rows, params, stats);
  for (std::size_t c = 0; c < count; ++c) {
    const double logp = -static_cast<double>(rows.row_loss[c]);
    const double old = rows.old_logps.empty() ? logp : static_cast<double>(rows.old_logps[c]);
    const double ratio = std::exp(logp - old);
    const double clipped = std::min(std::max(ratio, low_bound), high_bound);
    const double a = rows.advantages[c];
    const double w = rows.weights[c];
    const bool low = ratio < low_bound && a < 0.0;
    const bool high = ratio > high_bound && a > 0.0;
    double kl = 0.0;
    double d_kl = 0.0;  // d kl / d row_loss = exp(ref - logp) - 1
    if (!rows.ref_row_loss.empty()) {
      const double delta = -static_cast<double>(rows.ref_row_loss[c]) - logp;
      const double e = std::exp(delta);
      kl = e - delta - 1.0;
      d_kl = e - 1.0;
    }
    stats.loss += w * (-std::min(ratio * a, clipped * a) * rho[c] + params.beta * kl);
    stats.kl += kl;
    if (low) ++stats.low;
    if (high) ++stats.high;
    if (!rows.row_entropy.empty()) stats.entropy += static_cast<double>(rows.row_entropy[c]);
    if (!rows.sampled_logps.empty()) {
      stats.largest =
          std::max(stats.largest, std::abs(logp - static_cast<double>(rows.sampled_logps[c])));
    }
    if (!d_rows.empty()) {
      // -min(r A, r' A) follows r = exp(logp - old) unless the clip holds it (low or high);
      // logp = -row_loss: d(-r A)/d row_loss = r A; rho is a constant factor.
      const double surrogate = low || high ? 0.0 : a * ratio * rho[c];
      d_rows[c] = static_cast<float>(params.grad_scale * w * (surrogate + params.beta * d_kl));
    }
  }
  return stats;
}

}  // namespace l3::kernels::cpu
