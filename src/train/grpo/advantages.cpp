#include "train/grpo/advantages.hpp"

#include <cmath>

#include "core/error.hpp"

namespace l3::train::grpo {

namespace {

double mean_of(std::span<const double> values) {
  double sum = 0.0;
  for (const double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

}  // namespace

double unbiased_std(std::span<const double> values) {
  if (values.size() < 2) return 0.0;
  const double mean = mean_of(values);
  double squares = 0.0;
  for (const double v : values) squares += (v - mean) * (v - mean);
  return std::sqrt(squares / static_cast<double>(values.size() - 1));
}

Advantages compute_advantages(std::span<const double> rewards, std::int64_t group,
                              AdvantageEstimator estimator, RewardScaling scaling) {
  if (group < 1 || rewards.size() % static_cast<std::size_t>(group) != 0)
    throw core::internal_error("advantages: the rewards are not whole groups");
  const auto g = static_cast<std::size_t>(group);
  const std::size_t groups = rewards.size() / g;
  Advantages out;
  out.values.resize(rewards.size());
  out.group_std.resize(groups);
  out.batch_std = unbiased_std(rewards);
  std::size_t zero_std = 0;
  for (std::size_t k = 0; k < groups; ++k) {
    const std::span<const double> r = rewards.subspan(k * g, g);
    const double mean = mean_of(r);
    const double std = unbiased_std(r);
    out.group_std[k] = std;
    // torch.isclose(std, 0): |std| <= 1e-8 (its default atol; rtol x 0 adds nothing).
    if (std <= 1e-8) ++zero_std;
    const double scale = scaling == RewardScaling::group   ? std + kStdEpsilon
                         : scaling == RewardScaling::batch ? out.batch_std + kStdEpsilon
                                                           : 1.0;
    for (std::size_t i = 0; i < g; ++i) {
      double a = r[i] - mean;
      if (estimator == AdvantageEstimator::rloo && g > 1) {
        // r - (sum - r) / (G - 1), computed from the others' sum as RLOO defines it.
        double others = 0.0;
        for (std::size_t j = 0; j < g; ++j) {
          if (j != i) others += r[j];
        }
        a = r[i] - others / static_cast<double>(g - 1);
      }
      out.values[k * g + i] = a / scale;
    }
  }
  // TRL tests the deviation it divides by: the batch's under batch scaling.
  out.frac_zero_std = scaling == RewardScaling::batch ? (out.batch_std <= 1e-8 ? 1.0 : 0.0)
                      : groups > 0 ? static_cast<double>(zero_std) / static_cast<double>(groups)
                                   : 0.0;
  return out;
}

}  // namespace l3::train::grpo
