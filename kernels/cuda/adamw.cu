// AdamW on the fp32 master weights (torch.optim.AdamW's formula), refreshing the bf16 copy the
// matmuls read in the same pass. Memory-bound (28 bytes per parameter with bf16 gradients, 30
// with ZeRO-2's fp32 ones): four elements per thread with 16-byte fp32 and 8-byte bf16 accesses
// when every array allows it, one element per thread otherwise; both paths share the update so
// their results are identical bit for bit.
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

__device__ __forceinline__ float gradient(bf16 g) { return to_float(g); }
__device__ __forceinline__ float gradient(float g) { return g; }

// Grad: bf16 or float.
template <typename Grad>
__global__ void adamw_kernel(float* master, bf16* copy, const Grad* grads, float* m, float* v,
                             std::int64_t n, AdamWStep s) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float p = master[i];
    float mi = m[i];
    float vi = v[i];
    adamw_update(s, gradient(grads[i]), p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (copy != nullptr) copy[i] = to_bf16(p);
  }
}

__device__ __forceinline__ float4 gradients(const Bf16x4& g) {
  float4 f;
  f.x = to_float(g.v[0]);
  f.y = to_float(g.v[1]);
  f.z = to_float(g.v[2]);
  f.w = to_float(g.v[3]);
  return f;
}
__device__ __forceinline__ float4 gradients(const float4& g) { return g; }

// chunks = n / 4 groups of four; the caller runs the scalar kernel on the rest. Grad4: Bf16x4
// or float4.
template <typename Grad4>
__global__ void adamw_vec_kernel(float4* master, Bf16x4* copy, const Grad4* grads, float4* m,
                                 float4* v, std::int64_t chunks, AdamWStep s) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float4 p = master[c];
    float4 mm = m[c];
    float4 vv = v[c];
    const float4 g = gradients(grads[c]);
    adamw_update(s, g.x, p.x, mm.x, vv.x);
    adamw_update(s, g.y, p.y, mm.y, vv.y);
    adamw_update(s, g.z, p.z, mm.z, vv.z);
    adamw_update(s, g.w, p.w, mm.w, vv.w);
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

namespace {

AdamWStep step_constants(const kernels::AdamWParams& hyper) {
  const auto t = static_cast<double>(hyper.step);
  return {hyper.beta1,
          hyper.beta2,
          hyper.eps,
          1.0F - hyper.lr * hyper.weight_decay,
          hyper.grad_scale,
          hyper.lr / static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta1), t)),
          static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(hyper.beta2), t)))};
}

// Grad: bf16 or float, Grad4 the four-element access of it (Bf16x4, float4).
template <typename Grad, typename Grad4>
void launch_adamw(float* master, bf16* copy, const Grad* grads, float* m, float* v, std::int64_t n,
                  const kernels::AdamWParams& hyper, cudaStream_t stream) {
  if (n == 0) return;
  const AdamWStep s = step_constants(hyper);
  const bool vector = aligned(master, 16) && aligned(m, 16) && aligned(v, 16) &&
                      aligned(grads, sizeof(Grad4)) && (copy == nullptr || aligned(copy, 8));
  const std::int64_t chunks = vector ? n / 4 : 0;
  if (chunks > 0) {
    adamw_vec_kernel<<<grid_for(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(master), reinterpret_cast<Bf16x4*>(copy),
        reinterpret_cast<const Grad4*>(grads), reinterpret_cast<float4*>(m),
        reinterpret_cast<float4*>(v), chunks, s);
    check_launch("adamw (vectorised)");
  }
  const std::int64_t done = chunks * 4;
  if (done == n) return;
  adamw_kernel<<<grid_for(n - done), kThreads, 0, stream>>>(
      master + done, copy == nullptr ? nullptr : copy + done, grads + done, m + done, v + done,
      n - done, s);
  check_launch("adamw");
}

}  // namespace

void adamw(float* master, BFloat16* copy, const BFloat16* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream) {
  launch_adamw<bf16, Bf16x4>(master, copy == nullptr ? nullptr : device_cast(copy),
                             device_cast(grads), m, v, n, hyper, stream);
}

void adamw(float* master, BFloat16* copy, const float* grads, float* m, float* v, std::int64_t n,
           const kernels::AdamWParams& hyper, cudaStream_t stream) {
  launch_adamw<float, float4>(master, copy == nullptr ? nullptr : device_cast(copy), grads, m, v, n,
                              hyper, stream);
}

}  // namespace l3::cuda
