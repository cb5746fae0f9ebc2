// AdamW on the fp32 master weights (torch.optim.AdamW's formula), refreshing the bf16 copy the
// matmuls read in the same pass. Memory-bound (28 bytes per parameter): four elements per
// thread with 16-byte fp32 and 8-byte bf16 accesses when every array allows it, one element per
// thread otherwise; both paths share the update so their results are identical bit for bit.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

struct AdamWStep {
  float beta1, beta2, eps;
  float decay;       // 1 - lr * weight_decay
  float grad_scale;  // clipping
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
};

__device__ __forceinline__ void adamw_update(const AdamWStep& s, float grad, float& p, float& m,
                                             float& v) {
  const float g = grad * s.grad_scale;
  m = m + (1.0F - s.beta1) * (g - m);
  v = s.beta2 * v + (1.0F - s.beta2) * g * g;
  p = p * s.decay - s.step_size * m / (sqrtf(v) / s.bias2_sqrt + s.eps);
}

__global__ void adamw_kernel(float* master, bf16* copy, const bf16* grads, float* m, float* v,
                             std::int64_t n, AdamWStep s) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float p = master[i];
    float mi = m[i];
    float vi = v[i];
    adamw_update(s, to_float(grads[i]), p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (copy != nullptr) copy[i] = to_bf16(p);
  }
}

// Four bf16 values in one 8-byte access.
struct alignas(8) Bf16x4 {
  bf16 v[4];
};

// chunks = n / 4 groups of four; the caller runs the scalar kernel on the rest.
__global__ void adamw_vec_kernel(float4* master, Bf16x4* copy, const Bf16x4* grads, float4* m,
                                 float4* v, std::int64_t chunks, AdamWStep s) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float4 p = master[c];
    float4 mm = m[c];
    float4 vv = v[c];
    const Bf16x4 g = grads[c];
    adamw_update(s, to_float(g.v[0]), p.x, mm.x, vv.x);
    adamw_update(s, to_float(g.v[1]), p.y, mm.y, vv.y);
    adamw_update(s, to_float(g.v[2]), p.z, mm.z, vv.z);
    adamw_update(s, to_float(g.v[3]), p.w, mm.w, vv.w);
    master[c] = p;
    m[c] = mm;
    v[c] = vv;
    if (copy != nullptr) copy[c] = Bf16x4{{to_bf16(p.x), to_bf16(p.y), to_bf16(p.z), to_bf16(p.w)}};
  }
}

bool aligned(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0U;
}

unsigned int grid_for(std::int64_t n) { return std::min(blocks_for(n, kThreads), 65535U); }

}  // namespace

void adamw(float* master, BFloat16* copy, const BFloat16* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream) {
  if (n == 0) return;
  const auto t = static_cast<double>(hyper.step);
  const AdamWStep s{
      hyper.beta1,
      hyper.beta2,
      hyper.eps,
      1.0F - hyper.lr * hyper.weight_decay,
      hyper.grad_scale,
      hyper.lr / static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta1), t)),
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(hyper.beta2), t)))};
  bf16* copy_d = copy == nullptr ? nullptr : device_cast(copy);
  const bf16* grads_d = device_cast(grads);
  const bool vector = aligned(master, 16) && aligned(m, 16) && aligned(v, 16) &&
                      aligned(grads_d, 8) && (copy_d == nullptr || aligned(copy_d, 8));
  const std::int64_t chunks = vector ? n / 4 : 0;
  if (chunks > 0) {
    adamw_vec_kernel<<<grid_for(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(master), reinterpret_cast<Bf16x4*>(copy_d),
        reinterpret_cast<const Bf16x4*>(grads_d), reinterpret_cast<float4*>(m),
        reinterpret_cast<float4*>(v), chunks, s);
    check_launch("adamw (vectorised)");
  }
  const std::int64_t done = chunks * 4;
  if (done == n) return;
  adamw_kernel<<<grid_for(n - done), kThreads, 0, stream>>>(
      master + done, copy_d == nullptr ? nullptr : copy_d + done, grads_d + done, m + done,
      v + done, n - done, s);
  check_launch("adamw");
}

}  // namespace l3::cuda
