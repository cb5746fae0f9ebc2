#include "kernels/cpu/elementwise.hpp"

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/parallel.hpp"

namespace l3::kernels::cpu {

void add(std::span<float> out, std::span<const float> a, std::span<const float> b) {
  const auto n = static_cast<std::int64_t>(out.size());
  require_size(a.size(), n, "add", "a");
  require_size(b.size(), n, "add", "b");
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    out[static_cast<std::size_t>(i)] =
        a[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)];
  }
}

void scale(std::span<float> x, float alpha) {
  const auto n = static_cast<std::int64_t>(x.size());
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] *= alpha;
}

double sum_squares(std::span<const float> x) {
  return deterministic_sum(static_cast<std::int64_t>(x.size()),
                           [&](std::int64_t begin, std::int64_t end) {
                             double sum = 0.0;
#pragma omp simd reduction(+ : sum)
                             for (std::int64_t i = begin; i < end; ++i) {
                               const double v = x[static_cast<std::size_t>(i)];
                               sum += v * v;
                             }
                             return sum;
                           });
}

}  // namespace l3::kernels::cpu
