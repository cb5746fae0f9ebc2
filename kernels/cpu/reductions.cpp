#include "kernels/cpu/reductions.hpp"

#include "kernels/cpu/checks.hpp"
#include "kernels/cpu/parallel.hpp"

namespace l3::kernels::cpu {

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
