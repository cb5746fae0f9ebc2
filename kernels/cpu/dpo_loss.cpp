#include "kernels/cpu/dpo_loss.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"

namespace l3::kernels::cpu {

namespace {

// log(sigmoid(x)) = -softplus(-x), without overflow.
double log_sigmoid(double x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

void check_range(const RowRange& r, std::size_t rows, std::size_t s) {
  if (r.begin < 0 || r.end < r.begin || static_cast<std::size_t>(r.end) > rows) {
    throw core::internal_error(
        fmt::format("sequence {}: counted rows [{}, {}) outside [0, {})", s, r.begin, r.end, rows));
  }
}

double log_prob(std::span<const float> row_loss, const RowRange& r, bool mean) {
  double sum = 0.0;
  for (std::int32_t i = r.begin; i < r.end; ++i)
    sum -= static_cast<double>(row_loss[static_cast<std::size_t>(i)]);
  const std::int32_t count = r.end - r.begin;
  return mean && count > 0 ? sum / count : sum;
}

}  // namespace

void sequence_log_probs(std::span<double> logps, std::span<const float> row_loss,
                        std::span<const RowRange> ranges, bool mean) {
  if (logps.size() != ranges.size())
    throw core::internal_error("sequence_log_probs: a range per sequence");
  for (std::size_t s = 0; s < ranges.size(); ++s) {
    check_range(ranges[s], row_loss.size(), s);
    logps[s] = log_prob(row_loss, ranges[s], mean);
  }
}

DpoStats dpo_loss(std::span<const float> row_loss, std::span<const RowRange> ranges,
                  std::span<const double> reference, double beta, double label_smoothing,
                  DpoKind kind, float grad_scale, std::span<float> d_rows) {
  const std::size_t pairs = reference.size() / 2;
  const bool backward = !d_rows.empty();
  if (ranges.size() != 2 * pairs || (backward && d_rows.size() != row_loss.size()))
    throw core::internal_error("dpo_loss: arrays of different lengths");
  if (backward) std::fill(d_rows.begin(), d_rows.end(), 0.0F);
  const bool mean = kind == DpoKind::ipo;
  DpoStats stats;
  for (std::size_t p = 0; p < pairs; ++p) {
    const RowRange& c = ranges[p];
    const RowRange& r = ranges[pairs + p];
    check_range(c, row_loss.size(), p);
    check_range(r, row_loss.size(), pairs + p);
    const double chosen = log_prob(row_loss, c, mean) - reference[p];
    const double rejected = log_prob(row_loss, r, mean) - reference[pairs + p];
    const double h = chosen - rejected;
    double loss = 0.0;
    double dh = 0.0;  // d loss / d h
    if (kind == DpoKind::sigmoid) {
      const double z = beta * h;
      loss = -(1.0 - label_smoothing) * log_sigmoid(z) - label_smoothing * log_sigmoid(-z);
      dh = beta * (-(1.0 - label_smoothing) * sigmoid(-z) + label_smoothing * sigmoid(z));
    } else {
      const double e = h - 1.0 / (2.0 * beta);
      loss = e * e;
      dh = 2.0 * e;
    }
    const double chosen_reward = beta * chosen;
    const double rejected_reward = beta * rejected;
    stats.loss += loss;
    if (chosen_reward > rejected_reward) ++stats.correct;
    stats.margin += chosen_reward - rejected_reward;
    stats.chosen += chosen_reward;
    if (!backward) continue;
    // l(s) = -sum row_loss (/ count): d l / d row_loss = -1 (/ count); h = l(c) - l(r) + const.
    auto spread = [&](const RowRange& range, double d_logp) {
      const std::int32_t count = range.end - range.begin;
      const double per_row = -d_logp / (mean && count > 0 ? count : 1);
      for (std::int32_t i = range.begin; i < range.end; ++i)
        d_rows[static_cast<std::size_t>(i)] = static_cast<float>(grad_scale * per_row);
    };
    spread(c, dh);
    spread(r, -dh);
  }
  return stats;
}

}  // namespace l3::kernels::cpu
