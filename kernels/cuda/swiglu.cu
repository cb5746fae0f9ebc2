// SwiGLU out = silu(gate) * up and its gradient, elementwise in fp32; 16-byte accesses for the
// bulk of aligned buffers, scalar for the rest.
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

// The same, eight values per 16-byte access (chunks = n / 8; the caller does the tail).
__global__ void swiglu_forward_vec_kernel(bf16* out, const bf16* gate, const bf16* up,
                                          std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 g = reinterpret_cast<const Bf16x8*>(gate)[c];
    const Bf16x8 u = reinterpret_cast<const Bf16x8*>(up)[c];
    Bf16x8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gv = to_float(g.v[j]);
      o.v[j] = to_bf16(gv / (1.0F + __expf(-gv)) * to_float(u.v[j]));
    }
    reinterpret_cast<Bf16x8*>(out)[c] = o;
  }
}

__global__ void swiglu_backward_vec_kernel(bf16* dgate, bf16* dup, const bf16* dout,
                                           const bf16* gate, const bf16* up, std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 g = reinterpret_cast<const Bf16x8*>(gate)[c];
    const Bf16x8 u = reinterpret_cast<const Bf16x8*>(up)[c];
    const Bf16x8 d = reinterpret_cast<const Bf16x8*>(dout)[c];
    Bf16x8 dg;
    Bf16x8 du;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float gv = to_float(g.v[j]);
      const float dv = to_float(d.v[j]);
      const float sig = 1.0F / (1.0F + __expf(-gv));
      dg.v[j] = to_bf16(dv * to_float(u.v[j]) * sig * (1.0F + gv * (1.0F - sig)));
      du.v[j] = to_bf16(dv * gv * sig);
    }
    reinterpret_cast<Bf16x8*>(dgate)[c] = dg;
    reinterpret_cast<Bf16x8*>(dup)[c] = du;
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
  // 16-byte accesses for the bulk when the buffers allow, the scalar kernel for the rest.
  const std::int64_t vectorised = aligned16(out, gate, up) ? n / 8 * 8 : 0;
  if (vectorised > 0) {
    swiglu_forward_vec_kernel<<<grid(vectorised / 8), kThreads, 0, stream>>>(
        device_cast(out), device_cast(gate), device_cast(up), vectorised / 8);
    check_launch("swiglu forward (vectorised)");
  }
  if (n > vectorised) {
    swiglu_forward_kernel<<<grid(n - vectorised), kThreads, 0, stream>>>(
        device_cast(out) + vectorised, device_cast(gate) + vectorised, device_cast(up) + vectorised,
        n - vectorised);
    check_launch("swiglu forward");
  }
}

void swiglu_backward(BFloat16* dgate, BFloat16* dup, const BFloat16* dout, const BFloat16* gate,
                     const BFloat16* up, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const std::int64_t vectorised = aligned16(dgate, dup, dout, gate, up) ? n / 8 * 8 : 0;
  if (vectorised > 0) {
    swiglu_backward_vec_kernel<<<grid(vectorised / 8), kThreads, 0, stream>>>(
        device_cast(dgate), device_cast(dup), device_cast(dout), device_cast(gate), device_cast(up),
        vectorised / 8);
    check_launch("swiglu backward (vectorised)");
  }
  if (n > vectorised) {
    const std::int64_t v = vectorised;
    swiglu_backward_kernel<<<grid(n - v), kThreads, 0, stream>>>(
        device_cast(dgate) + v, device_cast(dup) + v, device_cast(dout) + v, device_cast(gate) + v,
        device_cast(up) + v, n - v);
    check_launch("swiglu backward");
  }
}

}  // namespace l3::cuda
