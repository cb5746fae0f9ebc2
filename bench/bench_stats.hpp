// Small statistics shared by the benchmarks.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

namespace l3::bench {

// The median of repeated measurements (the upper one of an even count); 0 for none.
[[nodiscard]] inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The median of field(item) over the items (step metrics, say).
template <class Item, class Field>
[[nodiscard]] double median_of(const std::vector<Item>& items, Field field) {
  std::vector<double> values;
  values.reserve(items.size());
  for (const Item& item : items) values.push_back(field(item));
  return median(std::move(values));
}

}  // namespace l3::bench
