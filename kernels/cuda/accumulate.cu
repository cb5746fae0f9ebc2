// dst += src, src bf16, the sum taken in fp32 and rounded once into a bf16 dst or kept in an fp32
// one (ZeRO-2: each micro-batch's reduced gradient piece added into the fp32 piece the optimizer
// keeps, so that micro-batches add up without a bf16 rounding each). 16-byte accesses for the
// bulk of aligned buffers (8 bf16, or 4 fp32 against 4 bf16), scalar for the rest.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

__global__ void add_kernel(bf16* dst, const bf16* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = to_bf16(to_float(dst[i]) + to_float(src[i]));
  }
}

// chunks = n / 8 groups of eight; the caller adds the tail with the kernel above.
__global__ void add_vec_kernel(Bf16x8* dst, const Bf16x8* src, std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Bf16x8 d = dst[c];
    const Bf16x8 s = src[c];
    for (int j = 0; j < 8; ++j) d.v[j] = to_bf16(to_float(d.v[j]) + to_float(s.v[j]));
    dst[c] = d;
  }
}

__global__ void add_f32_kernel(float* dst, const bf16* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] += to_float(src[i]);
  }
}

// chunks = n / 4 groups of four; the caller adds the tail with the kernel above.
__global__ void add_f32_vec_kernel(float4* dst, const Bf16x4* src, std::int64_t chunks) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       c < chunks; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float4 d = dst[c];
    const Bf16x4 s = src[c];
    d.x += to_float(s.v[0]);
    d.y += to_float(s.v[1]);
    d.z += to_float(s.v[2]);
    d.w += to_float(s.v[3]);
    dst[c] = d;
  }
}

unsigned int grid(std::int64_t n) {
  const unsigned int blocks = blocks_for(n, kThreads);
  return blocks < 65535U ? (blocks == 0 ? 1U : blocks) : 65535U;
}
}  // namespace

void add_into(BFloat16* dst, const BFloat16* src, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const std::int64_t chunks = aligned16(dst, src) ? n / 8 : 0;
  if (chunks > 0) {
    add_vec_kernel<<<grid(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<Bf16x8*>(dst), reinterpret_cast<const Bf16x8*>(src), chunks);
    check_launch("add (vectorised)");
  }
  const std::int64_t done = chunks * 8;
  if (done == n) return;
  add_kernel<<<grid(n - done), kThreads, 0, stream>>>(device_cast(dst + done),
                                                      device_cast(src + done), n - done);
  check_launch("add");
}

void add_into(float* dst, const BFloat16* src, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bf16* src_d = device_cast(src);
  const bool vector = reinterpret_cast<std::uintptr_t>(dst) % 16U == 0U &&
                      reinterpret_cast<std::uintptr_t>(src_d) % 8U == 0U;
  const std::int64_t chunks = vector ? n / 4 : 0;
  if (chunks > 0) {
    add_f32_vec_kernel<<<grid(chunks), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(dst), reinterpret_cast<const Bf16x4*>(src_d), chunks);
    check_launch("add into fp32 (vectorised)");
  }
  const std::int64_t done = chunks * 4;
  if (done == n) return;
  add_f32_kernel<<<grid(n - done), kThreads, 0, stream>>>(dst + done, src_d + done, n - done);
  check_launch("add into fp32");
}

}  // namespace l3::cuda
