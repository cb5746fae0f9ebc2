// Whether Catch2 was asked to list the tests (ctest's discovery at build time): mains that skip
// for a missing precondition (no GPU, no test data) must still answer that.
#pragma once

#include <string_view>

namespace l3::test {

inline bool listing_tests(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--list")) return true;  // NOLINT: argv
  }
  return false;
}

}  // namespace l3::test
