// SwiGLU out = silu(gate) * up and its gradient, elementwise in fp32.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]);
    out[i] = to_bf16(g / (1.0F + __expf(-g)) * to_float(up[i]));
  }
}

__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                       const bf16* up, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]);
    const float d = to_float(dout[i]);
    const float u = to_float(up[i]);
    const float sig = 1.0F / (1.0F + __expf(-g));
    dgate[i] = to_bf16(d * u * sig * (1.0F + g * (1.0F - sig)));
    dup[i] = to_bf16(d * g * sig);
  }
}

unsigned int grid(std::int64_t n) {
  const unsigned int blocks = blocks_for(n, kThreads);
  return blocks < 65535U ? blocks : 65535U;
}
}  // namespace

void swiglu_forward(BFloat16* out, const BFloat16* gate, const BFloat16* up, std::int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid(n), kThreads, 0, stream>>>(device_cast(out), device_cast(gate),
                                                          device_cast(up), n);
  check_launch("swiglu forward");
}

void swiglu_backward(BFloat16* dgate, BFloat16* dup, const BFloat16* dout, const BFloat16* gate,
                     const BFloat16* up, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid(n), kThreads, 0, stream>>>(device_cast(dgate), device_cast(dup),
                                                           device_cast(dout), device_cast(gate),
                                                           device_cast(up), n);
  check_launch("swiglu backward");
}

}  // namespace l3::cuda
