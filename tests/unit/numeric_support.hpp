// Test support for numerical kernels: random inputs from the test seed (fixed unless
// L3_TEST_SEED says otherwise, printed on failure: test_seed.hpp), relative errors, and central
// finite differences in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "test_seed.hpp"

namespace l3::test {

// Deterministic random vectors from (test seed, stream).
class Random {
 public:
  explicit Random(std::uint32_t stream) : rng_(test_seed(), core::RngPurpose::test, stream) {}
  std::vector<float> uniform(std::size_t n, float lo = -1.0F, float hi = 1.0F) {
    std::vector<float> v(n);
    for (float& x : v) x = lo + (hi - lo) * static_cast<float>(rng_.uniform(next_++));
    return v;
  }
  std::vector<float> normal(std::size_t n, float std = 1.0F) {
    std::vector<float> v(n);
    for (float& x : v) x = std * static_cast<float>(rng_.normal(next_++));
    return v;
  }
  std::vector<std::int32_t> integers(std::size_t n, std::int32_t below) {
    std::vector<std::int32_t> v(n);
    for (auto& x : v)
      x = static_cast<std::int32_t>(rng_.below(next_++, static_cast<std::uint64_t>(below)));
    return v;
  }
  double uniform01() { return rng_.uniform(next_++); }

 private:
  core::CounterRng rng_;
  std::uint64_t next_ = 0;
};

template <typename A, typename B>
double rel_error(const A& actual, const B& expected) {
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto a = static_cast<double>(actual[i]);
    const auto e = static_cast<double>(expected[i]);
    if (!std::isfinite(a)) return INFINITY;  // NaN never passes
    diff += (a - e) * (a - e);
    norm += e * e;
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central differences of a scalar function of x at every index of `indices` (all when empty):
// (f(x + h e_i) - f(x - h e_i)) / 2h, with h relative to |x_i|.
inline std::vector<double> finite_differences(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    std::vector<std::size_t> indices = {}, double step = 1e-5) {
  if (indices.empty()) {
    for (std::size_t i = 0; i < x.size(); ++i) indices.push_back(i);
  }
  std::vector<double> grad;
  grad.reserve(indices.size());
  for (const std::size_t i : indices) {
    const double original = x[i];
    const double h = step * std::max(1.0, std::abs(original));
    x[i] = original + h;
    const double plus = f(x);
    x[i] = original - h;
    const double minus = f(x);
    x[i] = original;
    grad.push_back((plus - minus) / (2 * h));
  }
  return grad;
}

// sum_i weights[i] * values[i]: turns a vector function into the scalar whose gradient is the
// vector-Jacobian product with `weights` (the upstream gradient of a backward pass).
inline double weighted_sum(const std::vector<double>& values, const std::vector<float>& weights) {
  double sum = 0.0;
  for (std::size_t i = 0; i < values.size(); ++i)
    sum += values[i] * static_cast<double>(weights[i]);
  return sum;
}

}  // namespace l3::test
