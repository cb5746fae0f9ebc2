// Reductions over flat arrays (gradient norms), deterministic for a given thread count.
#pragma once

#include <span>

namespace l3::kernels::cpu {

// Sum of squares accumulated in double, per-thread partial sums combined in thread order.
[[nodiscard]] double sum_squares(std::span<const float> x);

}  // namespace l3::kernels::cpu
