#include "core/rng.hpp"

#include <cmath>
#include <cstdint>
#include <numbers>

namespace l3::core {

namespace {
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53U;
constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57U;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9U;  // golden ratio
constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85U;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

struct HiLo {
  std::uint32_t hi;
  std::uint32_t lo;
};
constexpr HiLo mul_hi_lo(std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  return {static_cast<std::uint32_t>(product >> 32U), static_cast<std::uint32_t>(product)};
}

// 53 random bits -> (0, 1] when open_at_zero, else [0, 1).
constexpr double to_unit(std::uint64_t bits, bool open_at_zero) noexcept {
  constexpr double kScale = 1.0 / static_cast<double>(1ULL << 53U);
  const auto mantissa = static_cast<double>(bits >> 11U);
  return open_at_zero ? (mantissa + 1.0) * kScale : mantissa * kScale;
}

constexpr std::uint64_t join(std::uint32_t hi, std::uint32_t lo) noexcept {
  return (static_cast<std::uint64_t>(hi) << 32U) | lo;
}
}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) noexcept {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const HiLo p0 = mul_hi_lo(kPhiloxM0, counter[0]);
    const HiLo p1 = mul_hi_lo(kPhiloxM1, counter[2]);
    counter = {p1.hi ^ counter[1] ^ key[0], p1.lo, p0.hi ^ counter[3] ^ key[1], p0.lo};
    key[0] += kPhiloxW0;
    key[1] += kPhiloxW1;
  }
  return counter;
}

CounterRng::CounterRng(std::uint64_t seed, RngPurpose purpose, std::uint32_t stream) noexcept
    : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32U)},
      stream_(stream),
      purpose_(static_cast<std::uint32_t>(purpose)) {}

PhiloxCounter CounterRng::block(std::uint64_t index) const noexcept {
  return philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32U),
                        stream_, purpose_},
                       key_);
}

std::uint64_t CounterRng::bits64(std::uint64_t index) const noexcept {
  const PhiloxCounter b = block(index);
  return join(b[1], b[0]);
}

double CounterRng::uniform(std::uint64_t index) const noexcept {
  return to_unit(bits64(index), false);
}

double CounterRng::normal(std::uint64_t index) const noexcept {
  const PhiloxCounter b = block(index);
  const double u1 = to_unit(join(b[1], b[0]), true);  // (0, 1]: log(u1) is finite
  const double u2 = to_unit(join(b[3], b[2]), false);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::uint64_t CounterRng::below(std::uint64_t index, std::uint64_t n) const noexcept {
  // High 64 bits of the 128-bit product bits * n, from 32-bit halves (no __int128 needed).
  const std::uint64_t x = bits64(index);
  const std::uint64_t x_lo = x & 0xffffffffU;
  const std::uint64_t x_hi = x >> 32U;
  const std::uint64_t n_lo = n & 0xffffffffU;
  const std::uint64_t n_hi = n >> 32U;
  const std::uint64_t lo_lo = x_lo * n_lo;
  const std::uint64_t hi_lo = x_hi * n_lo;
  const std::uint64_t lo_hi = x_lo * n_hi;
  const std::uint64_t cross = (lo_lo >> 32U) + (hi_lo & 0xffffffffU) + lo_hi;
  return x_hi * n_hi + (hi_lo >> 32U) + (cross >> 32U);
}

void fill_uniform(std::span<float> out, float low, float high, const CounterRng& rng,
                  std::uint64_t first_index) noexcept {
  const auto n = static_cast<std::int64_t>(out.size());
  const double width = static_cast<double>(high) - static_cast<double>(low);
  constexpr std::int64_t kParallelFrom = std::int64_t{1} << 16;
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
  for (std::int64_t i = 0; i < n; ++i) {
    out[static_cast<std::size_t>(i)] =
        static_cast<float>(low + width * rng.uniform(first_index + static_cast<std::uint64_t>(i)));
  }
}

void fill_normal(std::span<float> out, float mean, float stddev, const CounterRng& rng,
                 std::uint64_t first_index) noexcept {
  // Each value depends on its index only, so the threads' split changes nothing. Large tensors
  // only: an 8B model's 7e9 values take minutes on one core (Philox, a log and a cosine each).
  const auto n = static_cast<std::int64_t>(out.size());
  constexpr std::int64_t kParallelFrom = std::int64_t{1} << 16;
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
  for (std::int64_t i = 0; i < n; ++i) {
    out[static_cast<std::size_t>(i)] =
        static_cast<float>(mean + stddev * rng.normal(first_index + static_cast<std::uint64_t>(i)));
  }
}

}  // namespace l3::core
