#include "report/smoothing.hpp"

#include <cmath>

namespace l3::report {

std::vector<double> smooth_ema(std::span<const double> values, double smoothing) {
  std::vector<double> out;
  out.reserve(values.size());
  double last = 0;
  double debias = 1;  // w^n
  for (const double value : values) {
    if (!std::isfinite(value)) {
      out.push_back(value);
      continue;
    }
    last = last * smoothing + (1 - smoothing) * value;
    debias *= smoothing;
    out.push_back(debias < 1 ? last / (1 - debias) : value);
  }
  return out;
}

}  // namespace l3::report
