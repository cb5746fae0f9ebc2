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

namespace l3::kernels::cpu {

// The same product with each element's arithmetic fixed, whatever the other rows: y[i][j] is
// the dot product of x's row i and W's row j summed in 16 lanes (lane l takes k = l mod 16, in
// ascending k, by fused multiply-adds) and the lanes added pairwise (8, 4, 2, 1). SGEMM's
// result for a row depends on how many rows the call has and where the row sits in it; this
// one does not, so that a generated completion is the same in any batch (MatmulArgs::
// row_invariant). Slower than SGEMM on large batches.
void matmul_row_invariant(std::span<float> y, std::span<const float> x, std::span<const float> w,
                          std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate);

}  // namespace l3::kernels::cpu
