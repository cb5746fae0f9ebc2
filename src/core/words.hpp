// Counts in words, for messages and logs: "1 step", "2 steps"; "2nd", "11th", "21st".
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace l3::core {

// "1 step", "0 steps", "2 steps" (the plural: `plural`, else the noun with an s).
[[nodiscard]] inline std::string count_of(std::int64_t n, std::string_view noun,
                                          std::string_view plural = {}) {
  if (n == 1 || n == -1) return fmt::format("{} {}", n, noun);
  return plural.empty() ? fmt::format("{} {}s", n, noun) : fmt::format("{} {}", n, plural);
}

// "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "102nd".
[[nodiscard]] inline std::string ordinal(std::int64_t n) {
  const std::int64_t tens = n % 100;
  const std::int64_t last = n % 10;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : last == 1                ? "st"
                       : last == 2                ? "nd"
                       : last == 3                ? "rd"
                                                  : "th";
  return fmt::format("{}{}", n, suffix);
}

}  // namespace l3::core
