// Element type conversions (initial weights, checkpoints, master -> compute copies): eight values
// per thread with 16-byte accesses when both sides are 16-byte aligned, one per thread for the
// rest; the same rounding either way.
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
// chunks = n / 8 groups of eight; the caller converts the tail with the kernels above.
__global__ void f32_to_bf16_vec_kernel(Bf16x8* out, const float4* in, std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float4 a = in[2 * c];
    const float4 b = in[2 * c + 1];
    out[c] = Bf16x8{{to_bf16(a.x), to_bf16(a.y), to_bf16(a.z), to_bf16(a.w), to_bf16(b.x),
                     to_bf16(b.y), to_bf16(b.z), to_bf16(b.w)}};
  }
}
__global__ void bf16_to_f32_vec_kernel(float4* out, const Bf16x8* in, std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 v = in[c];
    out[2 * c] = float4{to_float(v.v[0]), to_float(v.v[1]), to_float(v.v[2]), to_float(v.v[3])};
    out[2 * c + 1] = float4{to_float(v.v[4]), to_float(v.v[5]), to_float(v.v[6]), to_float(v.v[7])};
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
  const std::int64_t chunks = aligned16(out, in) ? n / 8 : 0;
  if (chunks > 0) {
    f32_to_bf16_vec_kernel<<<grid(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<Bf16x8*>(out), reinterpret_cast<const float4*>(in), chunks);
    check_launch("cast f32 -> bf16 (vectorised)");
  }
  const std::int64_t done = chunks * 8;
  if (done == n) return;
  f32_to_bf16_kernel<<<grid(n - done), kThreads, 0, stream>>>(device_cast(out + done), in + done,
                                                              n - done);
  check_launch("cast f32 -> bf16");
}

void cast_bf16_to_f32(float* out, const BFloat16* in, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const std::int64_t chunks = aligned16(out, in) ? n / 8 : 0;
  if (chunks > 0) {
    bf16_to_f32_vec_kernel<<<grid(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const Bf16x8*>(in), chunks);
    check_launch("cast bf16 -> f32 (vectorised)");
  }
  const std::int64_t done = chunks * 8;
  if (done == n) return;
  bf16_to_f32_kernel<<<grid(n - done), kThreads, 0, stream>>>(out + done, device_cast(in + done),
                                                              n - done);
  check_launch("cast bf16 -> f32");
}

void fill_bf16(BFloat16* out, float value, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16_kernel<<<grid(n), kThreads, 0, stream>>>(device_cast(out), value, n);
  check_launch("fill bf16");
}

}  // namespace l3::cuda
