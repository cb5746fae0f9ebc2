// Rotary position embedding, Hugging Face's rotate-half convention: element i of each head is
// paired with element i + head_dim/2 and rotated by the angle position * inv_freq[i].
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// In place on x (N, heads, head_dim); positions (N); cos, sin (max_position, head_dim/2).
void rope(std::span<float> x, std::span<const std::int32_t> positions, std::span<const float> cos,
          std::span<const float> sin, int heads, int head_dim);

// The transpose (inverse) rotation, applied in place to the gradient.
void rope_backward(std::span<float> dx, std::span<const std::int32_t> positions,
                   std::span<const float> cos, std::span<const float> sin, int heads, int head_dim);

}  // namespace l3::kernels::cpu
