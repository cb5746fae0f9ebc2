// ||a - b|| / ||a||, in double: how far two runs' weights or gradients are apart.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace l3::test {

template <typename T>
double relative_rms(const std::vector<T>& a, const std::vector<T>& b) {
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(a[i]) * static_cast<double>(a[i]);
  }
  return a.size() == b.size() ? std::sqrt(diff / std::max(norm, 1e-30)) : INFINITY;
}

}  // namespace l3::test
