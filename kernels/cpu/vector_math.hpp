// exp for the hot loops of the CPU kernels (softmax rows, SiLU): the same range reduction and
// polynomial as Cephes' expf (max relative error ~2e-7, i.e. 1-2 ulp; 0 below -87.3), written
// without calls or branches so that `#pragma omp simd` loops vectorise it. glibc's std::exp
// cannot be vectorised without -ffast-math.
#pragma once

#include <bit>
#include <cstdint>

namespace l3::kernels::cpu {

#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341F;
  constexpr float kLn2Hi = 0.693359375F;  // ln 2 split in two for an exact n * ln2
  constexpr float kLn2Lo = -2.12194440e-4F;
  constexpr float kRound = 12582912.0F;  // 1.5 * 2^23: adding it rounds to the nearest integer
  constexpr float kMin = -87.3F;         // below: exp underflows (the result is flushed to 0)
  constexpr float kMax = 88.3F;          // above: saturates at ~2.2e38 instead of overflowing
  const bool underflow = x < kMin;
  x = x > kMax ? kMax : (underflow ? kMin : x);
  const float n = (x * kLog2e + kRound) - kRound;  // nearest integer to x / ln 2
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;   // |r| <= ln2 / 2
  float p = 1.9875691500e-4F;
  p = p * r + 1.3981999507e-3F;
  p = p * r + 8.3334519073e-3F;
  p = p * r + 4.1665795894e-2F;
  p = p * r + 1.6666665459e-1F;
  p = p * r + 5.0000001201e-1F;
  const float e_r = p * r * r + r + 1.0F;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23U;
  const float result = e_r * std::bit_cast<float>(bits);  // e^r * 2^n
  return underflow ? 0.0F : result;
}

}  // namespace l3::kernels::cpu

// Hot row loops are compiled for AVX-512 and AVX2 as well as the baseline, and the best one the
// CPU supports is picked at load time (GCC/Clang function multiversioning), so that a portable
// build still runs them with wide vectors. Not under ThreadSanitizer: the clones' resolvers
// run while the program is being loaded, before the sanitizer's runtime, and crash it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_THREAD__)
#define L3_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
// For loops written with std::fma (the row-invariant matmul): AVX2 alone has no FMA
// instruction, so its clone would call libm's fmaf per element (a third of the time of
// generation with --deterministic on an AVX2 CPU); x86-64-v3 is AVX2 with FMA. A fused
// multiply-add is exactly rounded either way: the same bits on every clone.
#define L3_FMA_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define L3_VECTOR_CLONES
#define L3_FMA_CLONES
#endif

namespace l3::kernels::cpu {

struct SoftmaxRow {
  float max;  // of the row before exponentiation
  float sum;  // of exp(row - max)
};

// row[j] = exp(row[j] - max(row)) for j < n; returns the max and the sum.
SoftmaxRow exp_row(float* row, std::int64_t n);
// exp_row, and the softmax's entropy: log(sum) - (sum_j exp(x_j - max) (x_j - max)) / sum, with
// x the row before exponentiation (in nats; the same exponentials, summed in fp32).
SoftmaxRow exp_row_entropy(float* row, std::int64_t n, float& entropy);
// exp_row, and dot = sum_j exp(x_j - max) (x_j - max) (what the entropy is computed from).
SoftmaxRow exp_row_dot(float* row, std::int64_t n, float& dot);
// row[j] = exp(row[j] - shift)
void exp_shifted_row(float* row, std::int64_t n, float shift);
// row[j] *= factor
void scale_row(float* row, std::int64_t n, float factor);

}  // namespace l3::kernels::cpu
