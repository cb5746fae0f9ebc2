// Token embedding lookup and its gradient.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// out (N, H) = table (V, H) rows selected by tokens (N). A token outside [0, V) is an error.
void embedding(std::span<float> out, std::span<const std::int32_t> tokens,
               std::span<const float> table, std::int64_t hidden);

// dtable (V, H) += dout (N, H) scattered by tokens. Deterministic: each thread owns a range of
// columns and visits the tokens in order, so repeated tokens add up in the same order.
void embedding_backward(std::span<float> dtable, std::span<const std::int32_t> tokens,
                        std::span<const float> dout, std::int64_t hidden);

}  // namespace l3::kernels::cpu
