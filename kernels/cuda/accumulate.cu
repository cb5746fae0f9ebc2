// dst += src over bf16 buffers, the sum taken in fp32 and rounded once (ZeRO-2: each
// micro-batch's reduced gradient piece added into the piece the optimizer keeps). 16-byte
// accesses for the bulk of aligned buffers, scalar for the rest.
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

}  // namespace l3::cuda
