// AdamW on the fp32 master weights (torch.optim.AdamW's formula), refreshing the bf16 copy the
// matmuls read in the same pass.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void adamw_kernel(float* master, bf16* copy, const bf16* grads, float* m, float* v,
                             std::int64_t n, float beta1, float beta2, float eps, float decay,
                             float grad_scale, float step_size, float bias2_sqrt) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(grads[i]) * grad_scale;
    const float mi = m[i] + (1.0F - beta1) * (g - m[i]);
    const float vi = beta2 * v[i] + (1.0F - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = master[i] * decay - step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
    master[i] = p;
    if (copy != nullptr) copy[i] = to_bf16(p);
  }
}

}  // namespace

void adamw(float* master, BFloat16* copy, const BFloat16* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream) {
  if (n == 0) return;
  const auto t = static_cast<double>(hyper.step);
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta1), t));
  const auto bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(hyper.beta2), t)));
  const unsigned int blocks = std::min(blocks_for(n, kThreads), 65535U);
  adamw_kernel<<<blocks, kThreads, 0, stream>>>(
      master, copy == nullptr ? nullptr : device_cast(copy), device_cast(grads), m, v, n,
      hyper.beta1, hyper.beta2, hyper.eps, 1.0F - hyper.lr * hyper.weight_decay, hyper.grad_scale,
      hyper.lr / bias1, bias2_sqrt);
  check_launch("adamw");
}

}  // namespace l3::cuda
