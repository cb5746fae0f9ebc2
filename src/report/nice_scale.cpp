#include "report/nice_scale.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>

namespace l3::report {

namespace {

// Heckbert's nicenum: 1, 2, 5 or 10 times a power of ten near `x` (> 0); `round`: the nearest,
// else the smallest one at least `x`.
double nice_number(double x, bool round) {
  const double power = std::pow(10.0, std::floor(std::log10(x)));
  const double fraction = x / power;
  double nice = 10;
  if (round) {
    nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  } else {
    nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
  }
  return nice * power;
}

// The trailing zeros of a decimal fraction, and then its point, removed: "1.500" -> "1.5".
std::string trim_fraction(std::string text) {
  if (text.find('.') == std::string::npos) return text;
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

// `value` (finite, not 0) in fixed notation with `digits` significant digits, trimmed.
std::string significant(double value, int digits) {
  const int magnitude = static_cast<int>(std::floor(std::log10(std::abs(value))));
  const int decimals = std::clamp(digits - 1 - magnitude, 0, 20);
  std::string text = trim_fraction(fmt::format("{:.{}f}", value, decimals));
  return text == "-0" ? "0" : text;
}

// "3.000e-05" -> "3e-5": the mantissa trimmed, the exponent without its sign's "+" and zeros.
std::string short_exponent(double value) {
  const std::string text = fmt::format("{:.3e}", value);
  const std::size_t e = text.find('e');
  std::string mantissa = trim_fraction(text.substr(0, e));
  std::string_view exponent = std::string_view(text).substr(e + 1);
  const bool negative = exponent.front() == '-';
  exponent.remove_prefix(1);
  while (exponent.size() > 1 && exponent.front() == '0') exponent.remove_prefix(1);
  return fmt::format("{}e{}{}", mantissa, negative ? "-" : "", exponent);
}

struct Suffix {
  double scale;
  std::string_view text;
};

// Thousands, millions, ... as a suffix, for values from 1e4 on ("30.1k" reads better than
// "30104" or "3.01e+04"); `billions`: "G" on an axis, "B" for parameters.
Suffix suffix_for(double magnitude, std::string_view billions) {
  if (magnitude >= 1e12) return {1e12, "T"};
  if (magnitude >= 1e9) return {1e9, billions};
  if (magnitude >= 1e6) return {1e6, "M"};
  if (magnitude >= 1e4) return {1e3, "k"};
  return {1, ""};
}

std::string with_suffix(double value, std::string_view billions) {
  Suffix suffix = suffix_for(std::abs(value), billions);
  std::string digits = significant(value / suffix.scale, 4);
  // 999,999 rounds to "1000k": one suffix up instead ("1M").
  if (suffix.scale < 1e12 && std::abs(std::stod(digits)) >= 1000) {
    suffix = suffix_for(suffix.scale * 1000, billions);
    digits = significant(value / suffix.scale, 4);
  }
  return digits + std::string(suffix.text);
}

}  // namespace

NiceScale nice_scale(double min, double max, int target) {
  if (!std::isfinite(min) || !std::isfinite(max)) {
    min = 0;
    max = 1;
  }
  if (min > max) std::swap(min, max);
  // Within +-1e300, so that the range and its nice widening stay finite (values beyond, from a
  // hostile file, are drawn off the chart's edge).
  min = std::clamp(min, -1e300, 1e300);
  max = std::clamp(max, -1e300, 1e300);
  // Too narrow a range for doubles to step through (or a single value): a range around it.
  const double magnitude = std::max(std::abs(min), std::abs(max));
  if (max - min <= magnitude * 1e-9) {
    const double middle = min / 2 + max / 2;
    const double pad = middle == 0 ? 1 : std::abs(middle) * 0.1;
    min = middle - pad;
    max = middle + pad;
  }
  target = std::max(target, 2);
  const double step = nice_number(nice_number(max - min, false) / (target - 1), true);
  const double first = std::floor(min / step);
  const double last = std::ceil(max / step);
  NiceScale scale;
  scale.step = step;
  scale.lo = first * step;
  scale.hi = last * step;
  // Ticks as whole multiples of the step: no error accumulates, and 0 is exactly 0.
  const auto steps = static_cast<std::int64_t>(std::min(last - first, 1000.0));
  for (std::int64_t k = 0; k <= steps; ++k)
    scale.ticks.push_back((first + static_cast<double>(k)) * step + 0.0);
  return scale;
}

std::string format_number(double value) {
  if (std::isnan(value)) return "-";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  const double magnitude = std::abs(value);
  if (magnitude < 1e-3 || magnitude >= 1e15) return short_exponent(value);
  if (magnitude >= 1e4) return with_suffix(value, "G");
  return significant(value, 4);
}

std::string format_tick(double value, const NiceScale& scale) {
  const double magnitude = std::max(std::abs(scale.lo), std::abs(scale.hi));
  if (magnitude < 1e-3 || magnitude >= 1e15 || !(scale.step > 0)) return format_number(value);
  if (value == 0) return "0";
  const Suffix suffix = suffix_for(magnitude, "G");
  const int decimals = std::clamp(
      static_cast<int>(-std::floor(std::log10(scale.step / suffix.scale) + 1e-9)), 0, 12);
  const std::string text = fmt::format("{:.{}f}", value / suffix.scale, decimals);
  // "-0.0" (a tick next to 0 rounded) reads as 0.
  const bool zero = text.find_first_not_of("-0.") == std::string::npos;
  return fmt::format("{}{}", zero ? std::string_view("0") : std::string_view(text), suffix.text);
}

std::string format_count(double value) {
  if (!std::isfinite(value)) return "-";
  if (std::abs(value) < 1e3) return fmt::format("{:.0f}", value);
  if (std::abs(value) < 1e4) return significant(value / 1e3, 4) + "k";
  return with_suffix(value, "B");
}

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  const auto s = static_cast<long long>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

}  // namespace l3::report
