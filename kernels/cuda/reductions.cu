// Deterministic reductions: a fixed grid writes per-block partial sums (fp64), one block then
// sums them in a fixed tree. Same inputs, same result, bit for bit.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void sum_squares_partial_kernel(double* partials, const T* x, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double v = to_float(x[i]);
    sum += v * v;
  }
  __shared__ double scratch[kWarp];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// The bf16 partial sums with 16-byte loads (x 16-byte aligned): eight values per load, the
// n % 8 tail one at a time. Deterministic for a given buffer like the one-wide kernel (gradient
// pieces sit at the same offsets run after run), though the two sum in different orders.
__global__ void sum_squares_partial_vec_kernel(double* partials, const bf16* x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t chunks = n / 8;
  double sum = 0.0;
  for (std::int64_t c = first; c < chunks; c += stride) {
    const Bf16x8 v = reinterpret_cast<const Bf16x8*>(x)[c];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const double e = to_float(v.v[j]);
      sum += e * e;
    }
  }
  for (std::int64_t i = chunks * 8 + first; i < n; i += stride) {
    const double e = to_float(x[i]);
    sum += e * e;
  }
  __shared__ double scratch[kWarp];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void sum_partials_kernel(double* result, const double* partials, int count) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  __shared__ double scratch[kWarp];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) *result = sum;
}

__global__ void add_sum_f32_kernel(double* result, const float* x, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  __shared__ double scratch[kWarp];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) *result += sum;
}

}  // namespace

void sum_squares(double* result, const BFloat16* x, std::int64_t n, double* partials,
                 cudaStream_t stream) {
  if (aligned16(x)) {
    sum_squares_partial_vec_kernel<<<kSumSquaresBlocks, kThreads, 0, stream>>>(partials,
                                                                               device_cast(x), n);
  } else {
    sum_squares_partial_kernel<<<kSumSquaresBlocks, kThreads, 0, stream>>>(partials, device_cast(x),
                                                                           n);
  }
  check_launch("sum of squares (bf16)");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partials, kSumSquaresBlocks);
  check_launch("sum of squares (partials)");
}

void sum_squares_f32(double* result, const float* x, std::int64_t n, double* partials,
                     cudaStream_t stream) {
  sum_squares_partial_kernel<<<kSumSquaresBlocks, kThreads, 0, stream>>>(partials, x, n);
  check_launch("sum of squares (f32)");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partials, kSumSquaresBlocks);
  check_launch("sum of squares (partials)");
}

void add_sum_f32(double* result, const float* x, std::int64_t n, cudaStream_t stream) {
  add_sum_f32_kernel<<<1, kThreads, 0, stream>>>(result, x, n);
  check_launch("sum (f32)");
}

}  // namespace l3::cuda
