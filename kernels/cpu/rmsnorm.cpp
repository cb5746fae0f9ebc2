#include "kernels/cpu/rmsnorm.hpp"

#include <cmath>
#include <vector>

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/parallel.hpp"

namespace l3::kernels::cpu {

void rmsnorm(std::span<float> out, std::span<float> rstd, std::span<const float> x,
             std::span<const float> w, std::int64_t hidden, float eps) {
  const auto rows = static_cast<std::int64_t>(rstd.size());
  require_size(x.size(), rows * hidden, "rmsnorm", "x");
  require_size(out.size(), rows * hidden, "rmsnorm", "out");
  require_size(w.size(), hidden, "rmsnorm", "w");
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * hidden;
    float* yr = out.data() + r * hidden;
    float sum_sq = 0.0F;
#pragma omp simd reduction(+ : sum_sq)
    for (std::int64_t i = 0; i < hidden; ++i) sum_sq += xr[i] * xr[i];
    const float inv = 1.0F / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
    rstd[static_cast<std::size_t>(r)] = inv;
#pragma omp simd
    for (std::int64_t i = 0; i < hidden; ++i)
      yr[i] = (xr[i] * inv) * w[static_cast<std::size_t>(i)];
  }
}

void rmsnorm_backward(std::span<float> dx, std::span<float> dw, std::span<const float> dout,
                      std::span<const float> x, std::span<const float> w,
                      std::span<const float> rstd, std::int64_t hidden) {
  const auto rows = static_cast<std::int64_t>(rstd.size());
  require_size(x.size(), rows * hidden, "rmsnorm_backward", "x");
  require_size(dout.size(), rows * hidden, "rmsnorm_backward", "dout");
  require_size(dx.size(), rows * hidden, "rmsnorm_backward", "dx");
  require_size(w.size(), hidden, "rmsnorm_backward", "w");
  const bool weights = !dw.empty();  // empty: a frozen norm (LoRA), no weight gradient
  if (weights) require_size(dw.size(), hidden, "rmsnorm_backward", "dw");

  // dw partial sums per thread over its rows, combined in thread order (deterministic).
  const int threads = omp_get_max_threads();
  std::vector<float> partial_dw(weights ? static_cast<std::size_t>(threads * hidden) : 0U, 0.0F);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const Range share = static_share(rows, t, omp_get_num_threads());
    float* my_dw =
        weights ? partial_dw.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(hidden)
                : nullptr;
    for (std::int64_t r = share.begin; r < share.end; ++r) {
      const float* xr = x.data() + r * hidden;
      const float* gr = dout.data() + r * hidden;
      float* dxr = dx.data() + r * hidden;
      const float inv = rstd[static_cast<std::size_t>(r)];
      float dot = 0.0F;  // sum of g * xhat
#pragma omp simd reduction(+ : dot)
      for (std::int64_t i = 0; i < hidden; ++i)
        dot += gr[i] * w[static_cast<std::size_t>(i)] * (xr[i] * inv);
      const float mean_dot = dot / static_cast<float>(hidden);
#pragma omp simd
      for (std::int64_t i = 0; i < hidden; ++i) {
        const float xhat = xr[i] * inv;
        dxr[i] += inv * (gr[i] * w[static_cast<std::size_t>(i)] - xhat * mean_dot);
      }
      if (my_dw == nullptr) continue;
#pragma omp simd
      for (std::int64_t i = 0; i < hidden; ++i) my_dw[i] += gr[i] * (xr[i] * inv);
    }
  }
  if (!weights) return;
  for (int t = 0; t < threads; ++t) {
    const float* my_dw =
        partial_dw.data() + static_cast<std::size_t>(t) * static_cast<std::size_t>(hidden);
    for (std::int64_t i = 0; i < hidden; ++i) dw[static_cast<std::size_t>(i)] += my_dw[i];
  }
}

}  // namespace l3::kernels::cpu
