// The reward head's read-out: a score per selected row, score[p] = h[rows[p]] . w.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// scores (P); h (N, H); w (H); rows (P), each in [0, N).
void gather_dot(std::span<float> scores, std::span<const float> h, std::span<const float> w,
                std::span<const std::int32_t> rows, std::int64_t hidden);

// dh[rows[p]] += dscores[p] * w; dw += sum_p dscores[p] * h[rows[p]] (in p order).
void gather_dot_backward(std::span<float> dh, std::span<float> dw, std::span<const float> dscores,
                         std::span<const float> h, std::span<const float> w,
                         std::span<const std::int32_t> rows, std::int64_t hidden);

}  // namespace l3::kernels::cpu
