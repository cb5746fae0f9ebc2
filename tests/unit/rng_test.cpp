#include "core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "catch.hpp"

using l3::core::CounterRng;
using l3::core::RngPurpose;

TEST_CASE("Philox4x32-10 matches Random123's known-answer vectors", "[rng]") {
  using l3::core::philox4x32_10;
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        l3::core::PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        l3::core::PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        l3::core::PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("a draw is a pure function of (seed, purpose, stream, index)", "[rng]") {
  const CounterRng rng(1234, RngPurpose::parameter_init, 7);
  const CounterRng same(1234, RngPurpose::parameter_init, 7);
  std::vector<double> forward;
  for (std::uint64_t i = 0; i < 100; ++i) forward.push_back(rng.normal(i));
  for (std::uint64_t i = 100; i-- > 0;) CHECK(same.normal(i) == forward[i]);  // any order

  // Every coordinate of the key changes the numbers.
  const std::uint64_t index = 5;
  const double base = rng.uniform(index);
  CHECK(CounterRng(1235, RngPurpose::parameter_init, 7).uniform(index) != base);
  CHECK(CounterRng(1234, RngPurpose::data_order, 7).uniform(index) != base);
  CHECK(CounterRng(1234, RngPurpose::parameter_init, 8).uniform(index) != base);
  CHECK(CounterRng(1234ULL | (1ULL << 40U), RngPurpose::parameter_init, 7).uniform(index) != base);
  CHECK(rng.uniform(index + (1ULL << 32U)) != base);  // the high half of the index counts
}

TEST_CASE("uniform and normal have the right range and moments", "[rng]") {
  const CounterRng rng(42, RngPurpose::test);
  constexpr int n = 200000;
  double sum_u = 0;
  double sum_u2 = 0;
  double sum_z = 0;
  double sum_z2 = 0;
  double sum_z4 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform(static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum_u += u;
    sum_u2 += u * u;
    const double z = rng.normal(static_cast<std::uint64_t>(i));
    REQUIRE(std::isfinite(z));
    sum_z += z;
    sum_z2 += z * z;
    sum_z4 += z * z * z * z;
  }
  // Standard errors: mean(u) 0.00065, var(u) 0.0002, mean(z) 0.0022, var(z) 0.0032; 5 sigma.
  CHECK(std::abs(sum_u / n - 0.5) < 0.0035);
  CHECK(std::abs(sum_u2 / n - sum_u * sum_u / n / n - 1.0 / 12) < 0.001);
  CHECK(std::abs(sum_z / n) < 0.012);
  CHECK(std::abs(sum_z2 / n - 1.0) < 0.016);
  CHECK(std::abs(sum_z4 / n - 3.0) < 0.1);  // kurtosis of a normal
}

TEST_CASE("below(n) covers 0..n-1 evenly", "[rng]") {
  const CounterRng rng(7, RngPurpose::data_order, 3);
  constexpr std::uint64_t buckets = 10;
  constexpr int n = 100000;
  std::vector<int> counts(buckets, 0);
  for (int i = 0; i < n; ++i) {
    const std::uint64_t k = rng.below(static_cast<std::uint64_t>(i), buckets);
    REQUIRE(k < buckets);
    ++counts[k];
  }
  for (const int c : counts) CHECK(std::abs(c - n / 10) < 600);  // ~6.3 sigma of 95
  CHECK(rng.below(0, 1) == 0);
  // Huge n: results spread over the range rather than sticking to small values.
  const std::uint64_t big = ~0ULL - 12345;
  std::set<std::uint64_t> top_bits;
  for (std::uint64_t i = 0; i < 64; ++i) top_bits.insert(rng.below(i, big) >> 60U);
  CHECK(top_bits.size() > 8);
}

TEST_CASE("filling a tensor in pieces equals filling it whole", "[rng]") {
  const CounterRng rng(99, RngPurpose::parameter_init, 2);
  std::vector<float> whole(1000);
  l3::core::fill_normal(whole, 0.0F, 0.02F, rng);
  std::vector<float> pieces(1000);
  const std::span<float> all(pieces);
  l3::core::fill_normal(all.subspan(0, 333), 0.0F, 0.02F, rng, 0);
  l3::core::fill_normal(all.subspan(333), 0.0F, 0.02F, rng, 333);
  CHECK(whole == pieces);
  CHECK(std::all_of(whole.begin(), whole.end(), [](float x) { return std::abs(x) < 0.2F; }));
}

TEST_CASE("a large tensor filled by several threads holds each index's own value", "[rng]") {
  const CounterRng rng(7, RngPurpose::parameter_init, 3);
  std::vector<float> values(300000);  // past the size where the threads share the work
  l3::core::fill_normal(values, 0.5F, 0.02F, rng, 1000);
  bool all_equal = true;
  for (std::size_t i = 0; i < values.size(); ++i) {
    all_equal = all_equal && values[i] == static_cast<float>(0.5 + 0.02F * rng.normal(1000 + i));
  }
  CHECK(all_equal);
}

TEST_CASE("splitmix64 is a fixed, well-mixed function", "[rng]") {
  static_assert(l3::core::splitmix64(0) == 0xe220a8397b1dcdafULL);
  CHECK(l3::core::splitmix64(1) != l3::core::splitmix64(2));
}
