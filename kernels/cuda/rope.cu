// RoPE in place, Hugging Face's rotate-half pairing, tables (positions, head_dim/2) in fp32.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {
constexpr int kThreads = 256;

// One thread per (token, head, pair i < head_dim/2).
__global__ void rope_kernel(bf16* x, const std::int32_t* positions, const float* cos,
                            const float* sin, std::int64_t pairs_total, int heads, int half,
                            float sign) {
  const std::int64_t id = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (id >= pairs_total) return;
  const int i = static_cast<int>(id % half);
  const std::int64_t head_row = id / half;  // token * heads + head
  const std::int64_t token = head_row / heads;
  const std::int64_t table = static_cast<std::int64_t>(positions[token]) * half + i;
  const float c = cos[table];
  const float s = sign * sin[table];
  bf16* v = x + head_row * 2 * half;
  const float x1 = to_float(v[i]);
  const float x2 = to_float(v[i + half]);
  v[i] = to_bf16(x1 * c - x2 * s);
  v[i + half] = to_bf16(x2 * c + x1 * s);
}
}  // namespace

void rope(BFloat16* x, const std::int32_t* positions, const float* cos, const float* sin,
          std::int64_t n, int heads, int head_dim, float sign, cudaStream_t stream) {
  const int half = head_dim / 2;
  const std::int64_t total = n * heads * half;
  if (total == 0) return;
  rope_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(device_cast(x), positions, cos,
                                                                    sin, total, heads, half, sign);
  check_launch("rope");
}

}  // namespace l3::cuda
