// The seed of a test process's random inputs: fixed, so that CI runs the same inputs every time
// and a failure repeats, unless $L3_TEST_SEED says otherwise:
//   unset or empty   kDefaultTestSeed
//   a number         that seed (to replay a failure)
//   random           a fresh seed from std::random_device (to explore)
// Anything else is an error (thrown at the first draw, so the test that asked fails with it).
// Every test executable whose tests draw from it prints the seed at the end of a failed test
// case (seed_listener.hpp), whether or not the test case names it in an INFO.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>

namespace l3::test {

inline constexpr std::uint64_t kDefaultTestSeed = 20261203;

namespace detail {
inline std::atomic<bool>& test_seed_used() {
  static std::atomic<bool> used{false};
  return used;
}

inline std::uint64_t test_seed_from_environment() {
  const char* text = std::getenv("L3_TEST_SEED");
  if (text == nullptr || *text == '\0') return kDefaultTestSeed;
  const std::string value(text);
  if (value == "random") {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32U) ^ device();
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long seed = std::strtoull(text, &end, 10);
  if (value.front() == '-' || end == text || *end != '\0' || errno == ERANGE) {
    throw std::invalid_argument("L3_TEST_SEED=" + value +
                                ": expected a number from 0 to 2^64-1, or 'random'");
  }
  return static_cast<std::uint64_t>(seed);
}
}  // namespace detail

// The seed of this test run (the same for every call in a process).
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = detail::test_seed_from_environment();
  detail::test_seed_used() = true;
  return seed;
}

// Whether anything in this process asked for the seed (the listener prints it only then).
inline bool test_seed_used() { return detail::test_seed_used(); }

}  // namespace l3::test
