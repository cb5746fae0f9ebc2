// Small statistics shared by the benchmarks.
#pragma once

#include <algorithm>
#include <vector>

namespace l3::bench {

// The median of repeated measurements (the upper one of an even count); 0 for none.
[[nodiscard]] inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace l3::bench
