// Shape checks shared by the CPU kernels: a mismatch is a bug in the caller, reported with the
// kernel, the argument and both sizes.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string_view>

#include "core/error.hpp"

namespace l3::kernels::cpu {

inline void require_size(std::size_t actual, std::int64_t expected, std::string_view kernel,
                         std::string_view argument) {
  if (expected < 0 || actual != static_cast<std::size_t>(expected)) {
    throw core::internal_error(fmt::format("cpu {}: '{}' has {} elements, expected {}", kernel,
                                           argument, actual, expected));
  }
}

inline void require_at_least(std::size_t actual, std::int64_t expected, std::string_view kernel,
                             std::string_view argument) {
  if (expected < 0 || actual < static_cast<std::size_t>(expected)) {
    throw core::internal_error(fmt::format("cpu {}: '{}' has {} elements, needs at least {}",
                                           kernel, argument, actual, expected));
  }
}

// BLAS takes int dimensions.
inline int blas_int(std::int64_t value, std::string_view kernel) {
  if (value < 0 || value > std::numeric_limits<int>::max()) {
    throw core::internal_error(
        fmt::format("cpu {}: dimension {} does not fit BLAS's int", kernel, value));
  }
  return static_cast<int>(value);
}

}  // namespace l3::kernels::cpu
