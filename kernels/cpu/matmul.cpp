#include "kernels/cpu/matmul.hpp"

#include <cblas.h>

#include "kernels/cpu/checks.hpp"

namespace l3::kernels::cpu {

void matmul(std::span<float> y, std::span<const float> x, std::span<const float> w, std::int64_t m,
            std::int64_t n, std::int64_t k, bool accumulate) {
  require_size(y.size(), m * n, "matmul", "y");
  require_size(x.size(), m * k, "matmul", "x");
  require_size(w.size(), n * k, "matmul", "w");
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(m, "matmul"), blas_int(n, "matmul"),
              blas_int(k, "matmul"), 1.0F, x.data(), blas_int(k, "matmul"), w.data(),
              blas_int(k, "matmul"), accumulate ? 1.0F : 0.0F, y.data(), blas_int(n, "matmul"));
}

void matmul_backward(std::span<float> dx, std::span<float> dw, std::span<const float> dy,
                     std::span<const float> x, std::span<const float> w, std::int64_t m,
                     std::int64_t n, std::int64_t k, bool accumulate_dx) {
  require_size(dy.size(), m * n, "matmul_backward", "dy");
  const int im = blas_int(m, "matmul_backward");
  const int in = blas_int(n, "matmul_backward");
  const int ik = blas_int(k, "matmul_backward");
  if (!dx.empty()) {
    require_size(dx.size(), m * k, "matmul_backward", "dx");
    require_size(w.size(), n * k, "matmul_backward", "w");
    // dx (M, K) = dy (M, N) . W (N, K)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, ik, in, 1.0F, dy.data(), in,
                w.data(), ik, accumulate_dx ? 1.0F : 0.0F, dx.data(), ik);
  }
  if (!dw.empty()) {
    require_size(dw.size(), n * k, "matmul_backward", "dw");
    require_size(x.size(), m * k, "matmul_backward", "x");
    // dw (N, K) += dy^T (N, M) . x (M, K)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, ik, im, 1.0F, dy.data(), in, x.data(),
                ik, 1.0F, dw.data(), ik);
  }
}

}  // namespace l3::kernels::cpu
