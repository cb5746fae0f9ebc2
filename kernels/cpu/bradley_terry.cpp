#include "kernels/cpu/bradley_terry.hpp"

#include <cmath>

#include "core/error.hpp"

namespace l3::kernels::cpu {

namespace {
// log(1 + exp(x)) without overflow
double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}
}  // namespace

PreferenceStats bradley_terry(std::span<const float> chosen, std::span<const float> rejected,
                              std::span<const float> margins, double center_coefficient,
                              float grad_scale, std::span<float> d_chosen,
                              std::span<float> d_rejected) {
  const std::size_t pairs = chosen.size();
  const bool backward = !d_chosen.empty();
  if (rejected.size() != pairs || (!margins.empty() && margins.size() != pairs) ||
      (backward && (d_chosen.size() != pairs || d_rejected.size() != pairs))) {
    throw core::internal_error("bradley_terry: arrays of different lengths");
  }
  PreferenceStats stats;
  stats.pairs = static_cast<std::int64_t>(pairs);
  for (std::size_t p = 0; p < pairs; ++p) {
    const double c = chosen[p];
    const double r = rejected[p];
    const double z = c - r - (margins.empty() ? 0.0 : static_cast<double>(margins[p]));
    const double sum = c + r;
    stats.loss += softplus(-z) + center_coefficient * sum * sum;
    stats.margin += c - r;
    if (c > r) ++stats.correct;
    if (backward) {
      const double dz = -sigmoid(-z);  // d softplus(-z) / dz
      const double center = 2.0 * center_coefficient * sum;
      d_chosen[p] = static_cast<float>(grad_scale * (dz + center));
      d_rejected[p] = static_cast<float>(grad_scale * (-dz + center));
    }
  }
  return stats;
}

}  // namespace l3::kernels::cpu
