#include "kernels/cpu/token_sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/vector_math.hpp"

namespace l3::kernels::cpu {

namespace {

// The first id of the largest logit.
std::int32_t first_max(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Sorts the `count` most likely ids first in `order` (weight descending, lower id first on
// ties); the rest are left in no particular order.
void most_likely_first(std::vector<std::int32_t>& order, const std::vector<double>& weight,
                       std::size_t count) {
  const auto likelier = [&](std::int32_t a, std::int32_t b) {
    const double wa = weight[static_cast<std::size_t>(a)];
    const double wb = weight[static_cast<std::size_t>(b)];
    return wa > wb || (wa == wb && a < b);
  };
  count = std::min(count, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    likelier);
}

// The sum of the kept ids' weights, in ascending id order (the order of the draw).
double kept_total(const std::vector<std::int32_t>& kept, const std::vector<double>& weight) {
  double total = 0.0;
  for (const std::int32_t id : kept) total += weight[static_cast<std::size_t>(id)];
  return total;
}

}  // namespace

std::int32_t sample_row(std::span<const float> logits, const SamplingRule& rule, double u,
                        SamplingScratch& scratch) {
  if (rule.temperature == 0.0) return first_max(logits);
  const double max = logits[static_cast<std::size_t>(first_max(logits))];
  std::vector<double>& weight = scratch.weight;
  weight.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    // <= 1: never overflows
    weight[i] = std::exp((static_cast<double>(logits[i]) - max) / rule.temperature);
  }
  std::vector<std::int32_t>& order = scratch.order;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto size = order.size();
  const bool top_k = rule.top_k > 0 && static_cast<std::size_t>(rule.top_k) < size;
  if (top_k) {
    most_likely_first(order, weight, static_cast<std::size_t>(rule.top_k));
    order.resize(static_cast<std::size_t>(rule.top_k));
  }
  if (rule.top_p < 1.0) {
    std::sort(order.begin(), order.end());
    const double target = rule.top_p * kept_total(order, weight);
    // The nucleus: the most likely first until their weight reaches the target. Sorting a
    // growing head of the list finds it without sorting the whole vocabulary for a peaked row.
    std::size_t sorted = 0;
    std::size_t count = 0;
    double mass = 0.0;
    for (std::size_t head = 64;; head *= 4) {
      head = std::min(head, order.size());
      if (head > sorted) {
        most_likely_first(order, weight, head);
        // partial_sort reorders the whole head: the mass so far is recounted
        sorted = head;
        mass = 0.0;
        count = 0;
      }
      while (count < sorted && (count == 0 || mass < target)) {
        mass += weight[static_cast<std::size_t>(order[count])];
        ++count;
      }
      if (mass >= target || sorted == order.size()) break;
    }
    order.resize(count);
  }
  std::sort(order.begin(), order.end());  // the draw walks the kept ids in ascending order
  const double threshold = u * kept_total(order, weight);
  double running = 0.0;
  for (const std::int32_t id : order) {
    running += weight[static_cast<std::size_t>(id)];
    if (threshold < running) return id;
  }
  // Rounding left u * total at or above the last partial sum: the last kept id with weight.
  const auto last = std::find_if(order.rbegin(), order.rend(), [&](std::int32_t id) {
    return weight[static_cast<std::size_t>(id)] > 0.0;
  });
  return last == order.rend() ? order.front() : *last;
}

float row_logprob(std::span<const float> logits, std::int32_t token, float scale,
                  SamplingScratch& scratch) {
  std::vector<float>& row = scratch.row;
  row.assign(logits.begin(), logits.end());
  if (scale != 1.0F) {
    for (float& z : row) z *= scale;
  }
  const float target_logit = row[static_cast<std::size_t>(token)];
  const SoftmaxRow s = exp_row(row.data(), static_cast<std::int64_t>(row.size()));
  // cross_entropy.cpp's row loss, negated
  const double lse = static_cast<double>(s.max) + std::log(static_cast<double>(s.sum));
  return -static_cast<float>(lse - static_cast<double>(target_logit));
}

void sample_tokens(std::span<std::int32_t> tokens, std::span<float> logprobs,
                   std::span<const float> logits, std::span<const double> uniforms,
                   std::int64_t vocab, std::int64_t candidates, const SamplingRule& rule) {
  const auto n = static_cast<std::int64_t>(tokens.size());
#pragma omp parallel
  {
    SamplingScratch scratch;
#pragma omp for schedule(dynamic)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::span<const float> row =
          logits.subspan(static_cast<std::size_t>(i * vocab), static_cast<std::size_t>(vocab));
      const std::int32_t token = sample_row(row.first(static_cast<std::size_t>(candidates)), rule,
                                            uniforms[static_cast<std::size_t>(i)], scratch);
      tokens[static_cast<std::size_t>(i)] = token;
      if (!logprobs.empty()) {
        logprobs[static_cast<std::size_t>(i)] =
            row_logprob(row, token, rule.logprob_scale, scratch);
      }
    }
  }
}

}  // namespace l3::kernels::cpu
