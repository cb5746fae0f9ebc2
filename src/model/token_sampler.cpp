#include "model/token_sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"

namespace l3::model {

void validate(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0) {
    throw core::usage_error(
        fmt::format("temperature must be >= 0 (0: greedy), not {}", params.temperature));
  }
  if (!(params.top_p > 0.0 && params.top_p <= 1.0)) {
    throw core::usage_error(fmt::format("top-p must be in (0, 1], not {}", params.top_p));
  }
}

std::int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) throw core::internal_error("argmax of no logits");
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params, double u) {
  validate(params);
  if (params.temperature == 0.0) return argmax(logits);

  // softmax(logits / T) in double: the weights are exp((l - max) / T) <= 1, never overflow.
  const double max = logits[static_cast<std::size_t>(argmax(logits))];
  std::vector<double> weight(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    weight[i] = std::exp((static_cast<double>(logits[i]) - max) / params.temperature);
  }
  const double total = std::accumulate(weight.begin(), weight.end(), 0.0);

  // The candidates in the order the draw walks them: all ids in order, or for top-p < 1 the
  // nucleus from the most likely down (stable: equal weights keep the lower id first).
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  double kept = total;
  if (params.top_p < 1.0) {
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      return weight[static_cast<std::size_t>(a)] > weight[static_cast<std::size_t>(b)];
    });
    const double target = params.top_p * total;
    double mass = 0.0;
    std::size_t count = 0;
    while (count < order.size() && (count == 0 || mass < target)) {
      mass += weight[static_cast<std::size_t>(order[count])];
      ++count;
    }
    order.resize(count);
    kept = mass;
  }

  const double threshold = u * kept;
  double mass = 0.0;
  for (const std::int32_t id : order) {
    mass += weight[static_cast<std::size_t>(id)];
    if (threshold < mass) return id;
  }
  // Rounding left u * kept at or above the last partial sum: the last candidate with weight.
  const auto last = std::find_if(order.rbegin(), order.rend(), [&](std::int32_t id) {
    return weight[static_cast<std::size_t>(id)] > 0.0;
  });
  return last == order.rend() ? order.front() : *last;
}

}  // namespace l3::model
