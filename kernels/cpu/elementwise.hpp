// Elementwise helpers: the residual add, scaling, and squared norms (deterministic).
#pragma once

#include <span>

namespace l3::kernels::cpu {

// out = a + b; out may alias a or b.
void add(std::span<float> out, std::span<const float> a, std::span<const float> b);
void scale(std::span<float> x, float alpha);
// Sum of squares accumulated in double, combined in a fixed order.
[[nodiscard]] double sum_squares(std::span<const float> x);

}  // namespace l3::kernels::cpu
