#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(bf16* out, const float* in, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_bf16(in[i]);
  }
}
__global__ void bf16_to_f32_kernel(float* out, const bf16* in, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_float(in[i]);
  }
}
__global__ void fill_bf16_kernel(bf16* out, float value, std::int64_t n) {
  const bf16 v = to_bf16(value);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = v;
  }
}
unsigned int grid(std::int64_t n) {
  const unsigned int blocks = blocks_for(n, kThreads);
  return blocks < 65535U ? (blocks == 0 ? 1U : blocks) : 65535U;
}
}  // namespace

void cast_f32_to_bf16(BFloat16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid(n), kThreads, 0, stream>>>(device_cast(out), in, n);
  check_launch("cast f32 -> bf16");
}

void cast_bf16_to_f32(float* out, const BFloat16* in, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid(n), kThreads, 0, stream>>>(out, device_cast(in), n);
  check_launch("cast bf16 -> f32");
}

void fill_bf16(BFloat16* out, float value, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<grid(n), kThreads, 0, stream>>>(device_cast(out), value, n);
  check_launch("fill bf16");
}

}  // namespace l3::cuda
