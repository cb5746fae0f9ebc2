// Linear layers on OpenBLAS SGEMM. W is stored [out, in] (Hugging Face), so y = x W^T.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// y (M, N) = x (M, K) W^T with W (N, K); y += ... when accumulate.
void matmul(std::span<float> y, std::span<const float> x, std::span<const float> w, std::int64_t m,
            std::int64_t n, std::int64_t k, bool accumulate);

// dx (M, K) = dy (M, N) W (+= when accumulate_dx; skipped when dx is empty);
// dw (N, K) += dy^T x (skipped when dw is empty).
void matmul_backward(std::span<float> dx, std::span<float> dw, std::span<const float> dy,
                     std::span<const float> x, std::span<const float> w, std::int64_t m,
                     std::int64_t n, std::int64_t k, bool accumulate_dx);

}  // namespace l3::kernels::cpu
