// Deterministic, counter-based random numbers: every draw is a pure function of
// (seed, purpose, stream, index), so any rank or thread can produce exactly the numbers it needs
// in any order, a restart reproduces them without saved generator state, and a GPU kernel can
// compute the same values from the same counters.
//
// Generator: Philox4x32-10 (Salmon et al., SC'11), verified against Random123's known answers.
// Counter = (index low, index high, stream, purpose), key = (seed low, seed high).
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace l3::core {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

[[nodiscard]] PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) noexcept;

// What a stream of numbers is for. The values are part of the reproducibility contract
// (checkpoints and reruns depend on them): add new ones, never renumber.
enum class RngPurpose : std::uint32_t {
  parameter_init = 1,    // stream = tensor index
  data_order = 2,        // stream = epoch
  sampling = 3,          // generate: stream = request
  validation_split = 4,  // prep --val-fraction: stream = input file index
  demo_data = 5,         // the demo's built-in datasets: stream = dataset
  adapter_init = 6,      // LoRA's initial adapters: stream = tensor index in the adapter layout
  lora_dropout =
      7,  // LoRA's dropout masks: stream = step, index = (rank, micro-batch, layer, target)
  grpo_sampling = 8,  // GRPO's rollouts: stream = step; bits64(0) seeds that step's sampling
  test = 0x7e57,      // tests and benchmarks
};

class CounterRng {
 public:
  CounterRng(std::uint64_t seed, RngPurpose purpose, std::uint32_t stream = 0) noexcept;

  // The four 32-bit words of block `index`.
  [[nodiscard]] PhiloxCounter block(std::uint64_t index) const noexcept;
  [[nodiscard]] std::uint64_t bits64(std::uint64_t index) const noexcept;
  // Uniform in [0, 1) with 53 random bits.
  [[nodiscard]] double uniform(std::uint64_t index) const noexcept;
  // Standard normal (Box-Muller on the two 53-bit halves of one block).
  [[nodiscard]] double normal(std::uint64_t index) const noexcept;
  // Uniform integer in [0, n), n > 0 (128-bit multiply-high; bias below n / 2^64).
  [[nodiscard]] std::uint64_t below(std::uint64_t index, std::uint64_t n) const noexcept;

 private:
  PhiloxKey key_;
  std::uint32_t stream_;
  std::uint32_t purpose_;
};

// out[i] = mean + stddev * normal(first_index + i): filling a tensor in pieces (one per rank or
// thread) gives the same values as filling it whole.
void fill_normal(std::span<float> out, float mean, float stddev, const CounterRng& rng,
                 std::uint64_t first_index = 0) noexcept;

// out[i] = low + (high - low) * uniform(first_index + i), in pieces as fill_normal.
void fill_uniform(std::span<float> out, float low, float high, const CounterRng& rng,
                  std::uint64_t first_index = 0) noexcept;

// SplitMix64 finaliser: a fast bijective mixer for deriving seeds and hashing small keys.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31U);
}

}  // namespace l3::core
