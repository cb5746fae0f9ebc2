// Scaled dropout, out = x * scale * keep_i / (1 - p), with the shared mask of
// kernels/dropout_mask.hpp (Ops::dropout). out may alias x.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

void dropout(std::span<float> out, std::span<const float> x, float p, float scale,
             std::uint64_t seed);

}  // namespace l3::kernels::cpu
