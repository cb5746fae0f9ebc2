#include "kernels/cpu/policy_loss.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace l3::kernels::cpu {

namespace {

bool fits(std::span<const float> x, std::size_t count) { return x.empty() || x.size() == count; }

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
    stats.loss += w * (-std::min(ratio * a, clipped * a) + params.beta * kl);
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
      // logp = -row_loss: d(-r A)/d row_loss = r A.
      const double surrogate = low || high ? 0.0 : a * ratio;
      d_rows[c] = static_cast<float>(params.grad_scale * w * (surrogate + params.beta * d_kl));
    }
  }
  return stats;
}

}  // namespace l3::kernels::cpu
