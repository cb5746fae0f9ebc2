// The reward score read-out (one dot product per selected row) and its gradient.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void gather_dot_kernel(float* scores, const bf16* h, const bf16* w,
                                  const std::int32_t* rows, std::int64_t hidden) {
  __shared__ float scratch[kWarp];
  const bf16* hr = h + static_cast<std::int64_t>(rows[blockIdx.x]) * hidden;
  float sum = 0.0F;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    sum += to_float(hr[i]) * to_float(w[i]);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) scores[blockIdx.x] = sum;
}

// One thread per column, the scores in order: deterministic, and repeated rows add up.
__global__ void gather_dot_backward_kernel(bf16* dh, bf16* dw, const float* dscores, const bf16* h,
                                           const bf16* w, const std::int32_t* rows,
                                           std::int64_t count, std::int64_t hidden) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= hidden) return;
  const float wc = to_float(w[c]);
  float dwc = 0.0F;
  for (std::int64_t p = 0; p < count; ++p) {
    const std::int64_t at = static_cast<std::int64_t>(rows[p]) * hidden + c;
    dh[at] = to_bf16(to_float(dh[at]) + dscores[p] * wc);
    dwc += dscores[p] * to_float(h[at]);
  }
  dw[c] = to_bf16(to_float(dw[c]) + dwc);
}

}  // namespace

void gather_dot(float* scores, const BFloat16* h, const BFloat16* w, const std::int32_t* rows,
                std::int64_t count, std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_dot_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      scores, device_cast(h), device_cast(w), rows, hidden);
  check_launch("score read-out");
}

void gather_dot_backward(BFloat16* dh, BFloat16* dw, const float* dscores, const BFloat16* h,
                         const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                         std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_dot_backward_kernel<<<blocks_for(hidden, kThreads), kThreads, 0, stream>>>(
      device_cast(dh), device_cast(dw), dscores, device_cast(h), device_cast(w), rows, count,
      hidden);
  check_launch("score read-out backward");
}

}  // namespace l3::cuda
