// An axis's range and ticks at round values (0, 0.5, 1, 1.5 rather than 0.037, 0.51, 0.98), and
// numbers written short: a chart is read at a glance, and its SVG text stays small.
#pragma once

#include <string>
#include <vector>

namespace l3::report {

// The "nice numbers" of Heckbert (Graphics Gems, 1990): a tick step of 1, 2 or 5 times a power
// of ten, and a range widened outwards to whole steps, so that every tick is a multiple of the
// step and the data lie inside [lo, hi].
struct NiceScale {
  double lo = 0;
  double hi = 1;
  double step = 0.5;
  std::vector<double> ticks;  // lo, lo + step, ..., hi: multiples of step (0 is exactly 0)
};

// About `target` ticks covering [min, max]. A single value (min == max) gets a range around it;
// non-finite bounds give [0, 1].
[[nodiscard]] NiceScale nice_scale(double min, double max, int target = 5);

// A value with at most 4 significant digits: "0.0385", "13.81", "3e-5", "30.1k", "1.2M"
// (thousands and millions with a suffix, tiny values in exponent form); "-" for NaN.
[[nodiscard]] std::string format_number(double value);

// A tick label: every tick of one axis in the same form, with as many decimals as the step
// needs ("0", "0.5", "1", "1.5"; "0", "5k", "10k"; "1e-5", "1.5e-5").
[[nodiscard]] std::string format_tick(double value, const NiceScale& scale);

// A count of parameters: "124.4M", "8.03B", "950".
[[nodiscard]] std::string format_count(double value);

// A duration in seconds: "0.8s", "42s", "3m05s", "1h02m".
[[nodiscard]] std::string format_seconds(double seconds);

}  // namespace l3::report
