#include "kernels/cpu/rope.hpp"

#include "kernels/cpu/checks.hpp"

namespace l3::kernels::cpu {

namespace {
// sign = +1: forward rotation; -1: its transpose.
void rotate(std::span<float> x, std::span<const std::int32_t> positions, std::span<const float> cos,
            std::span<const float> sin, int heads, int head_dim, float sign,
            std::string_view kernel) {
  const auto n = static_cast<std::int64_t>(positions.size());
  const int half = head_dim / 2;
  require_size(x.size(), n * heads * head_dim, kernel, "x");
  const auto max_position = static_cast<std::int64_t>(cos.size()) / (half == 0 ? 1 : half);
  require_size(sin.size(), max_position * half, kernel, "sin");
  for (std::size_t t = 0; t < positions.size(); ++t) {
    if (positions[t] < 0 || positions[t] >= max_position) {
      throw core::internal_error(
          fmt::format("cpu {}: position {} of token {} outside the table "
                      "[0, {})",
                      kernel, positions[t], t, max_position));
    }
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < n; ++t) {
    const float* c =
        cos.data() + static_cast<std::int64_t>(positions[static_cast<std::size_t>(t)]) * half;
    const float* s =
        sin.data() + static_cast<std::int64_t>(positions[static_cast<std::size_t>(t)]) * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x.data() + (t * heads + h) * head_dim;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float x1 = v[i];
        const float x2 = v[i + half];
        const float si = sign * s[i];
        v[i] = x1 * c[i] - x2 * si;
        v[i + half] = x2 * c[i] + x1 * si;
      }
    }
  }
}
}  // namespace

void rope(std::span<float> x, std::span<const std::int32_t> positions, std::span<const float> cos,
          std::span<const float> sin, int heads, int head_dim) {
  rotate(x, positions, cos, sin, heads, head_dim, 1.0F, "rope");
}

void rope_backward(std::span<float> dx, std::span<const std::int32_t> positions,
                   std::span<const float> cos, std::span<const float> sin, int heads,
                   int head_dim) {
  rotate(dx, positions, cos, sin, heads, head_dim, -1.0F, "rope_backward");
}

}  // namespace l3::kernels::cpu
