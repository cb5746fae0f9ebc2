#include "kernels/cpu/vector_math.hpp"

#include <cmath>
#include <limits>

namespace l3::kernels::cpu {

L3_VECTOR_CLONES SoftmaxRow exp_row(float* row, std::int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (std::int64_t j = 0; j < n; ++j) max = row[j] > max ? row[j] : max;
  float sum = 0.0F;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < n; ++j) {
    row[j] = exp_approx(row[j] - max);
    sum += row[j];
  }
  return {max, sum};
}

L3_VECTOR_CLONES SoftmaxRow exp_row_dot(float* row, std::int64_t n, float& dot) {
  float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
  for (std::int64_t j = 0; j < n; ++j) max = row[j] > max ? row[j] : max;
  float sum = 0.0F;
  float acc = 0.0F;  // sum of exp(x - max) (x - max)
#pragma omp simd reduction(+ : sum, acc)
  for (std::int64_t j = 0; j < n; ++j) {
    const float shifted = row[j] - max;
    row[j] = exp_approx(shifted);
    sum += row[j];
    // exp underflows to 0 where shifted is -inf or very negative: no contribution (not 0 * inf)
    acc += row[j] > 0.0F ? row[j] * shifted : 0.0F;
  }
  dot = acc;
  return {max, sum};
}

SoftmaxRow exp_row_entropy(float* row, std::int64_t n, float& entropy) {
  float dot = 0.0F;
  const SoftmaxRow s = exp_row_dot(row, n, dot);
  entropy = std::log(s.sum) - dot / s.sum;
  return s;
}

L3_VECTOR_CLONES void exp_shifted_row(float* row, std::int64_t n, float shift) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) row[j] = exp_approx(row[j] - shift);
}

L3_VECTOR_CLONES void scale_row(float* row, std::int64_t n, float factor) {
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) row[j] *= factor;
}

}  // namespace l3::kernels::cpu
