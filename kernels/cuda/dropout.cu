// Scaled dropout out = x * scale * keep_i / (1 - p) (Ops::dropout), elementwise in fp32 with the
// mask of kernels/dropout_mask.hpp, the CPU backend's bit for bit.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/dropout_mask.hpp"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void dropout_kernel(bf16* out, const bf16* x, std::int64_t n, float kept_scale,
                               std::uint32_t threshold, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const bool keep =
        threshold == 0U || kernels::dropout_keep(seed, static_cast<std::uint64_t>(i), threshold);
    out[i] = to_bf16(keep ? to_float(x[i]) * kept_scale : 0.0F);
  }
}

unsigned int grid(std::int64_t n) {
  const unsigned int blocks = blocks_for(n, kThreads);
  return blocks < 65535U ? blocks : 65535U;
}
}  // namespace

void dropout(BFloat16* out, const BFloat16* x, std::int64_t n, float p, float scale,
             std::uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  // p = 0 keeps every element (threshold 0), scaled by `scale` alone.
  dropout_kernel<<<grid(n), kThreads, 0, stream>>>(
      device_cast(out), device_cast(x), n, scale / (1.0F - p), kernels::dropout_threshold(p), seed);
  check_launch("dropout");
}

}  // namespace l3::cuda
