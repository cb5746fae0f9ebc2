// The row-wise kernels of the fallback attention (the GEMMs run on cuBLAS, batched over heads):
// causal softmax with log-sum-exp, its recomputation in the backward, D = rowsum(dO * O), and
// dS = P * (dP - D). Scores of one segment are (heads, L, L), row i = query i.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/softmax_stats.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

// One block per (head, query row); the statistics in one pass over the visible scores.
__global__ void causal_softmax_kernel(bf16* probs, float* lse, const float* scores,
                                      std::int64_t length, std::int64_t lse_stride) {
  const std::int64_t head = blockIdx.y;
  const std::int64_t row = blockIdx.x;
  const std::int64_t visible = row + 1;
  const float* s = scores + (head * length + row) * length;
  bf16* p = probs + (head * length + row) * length;
  SoftmaxStats stats;
  for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) stats.add(s[j]);
  stats = block_merge(stats);
  const float max = stats.max;
  const float sum = stats.sum;
  const float inv = 1.0F / sum;
  for (std::int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    p[j] = to_bf16(j < visible ? __expf(s[j] - max) * inv : 0.0F);
  }
  if (threadIdx.x == 0) lse[head * lse_stride + row] = max + logf(sum);
}

__global__ void causal_probs_kernel(bf16* probs, const float* scores, const float* lse,
                                    std::int64_t length, std::int64_t lse_stride) {
  const std::int64_t head = blockIdx.y;
  const std::int64_t row = blockIdx.x;
  const float l = lse[head * lse_stride + row];
  const float* s = scores + (head * length + row) * length;
  bf16* p = probs + (head * length + row) * length;
  for (std::int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    p[j] = to_bf16(j <= row ? __expf(s[j] - l) : 0.0F);
  }
}

// One warp per (row, head).
__global__ void row_dot_kernel(float* dot, const bf16* dout, const bf16* out, int heads,
                               std::int64_t length, int head_dim) {
  const std::int64_t warp =
      (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= length * heads) return;
  const std::int64_t row = warp / heads;
  const int head = static_cast<int>(warp % heads);
  const std::int64_t base = (row * heads + head) * head_dim;
  float sum = 0.0F;
  for (int d = lane; d < head_dim; d += kWarp)
    sum += to_float(dout[base + d]) * to_float(out[base + d]);
  sum = warp_sum(sum);
  if (lane == 0) dot[head * length + row] = sum;
}

__global__ void dscores_kernel(bf16* dscores, const bf16* probs, const float* dprobs,
                               const float* dot, std::int64_t dot_stride, std::int64_t length,
                               float scale) {
  const std::int64_t head = blockIdx.y;
  const std::int64_t row = blockIdx.x;
  const float d = dot[head * dot_stride + row];
  const std::int64_t base = (head * length + row) * length;
  for (std::int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    dscores[base + j] = to_bf16(scale * to_float(probs[base + j]) * (dprobs[base + j] - d));
  }
}

}  // namespace

void causal_softmax(BFloat16* probs, float* lse, const float* scores, int heads,
                    std::int64_t length, std::int64_t lse_stride, cudaStream_t stream) {
  if (length == 0) return;
  const dim3 grid(static_cast<unsigned int>(length), static_cast<unsigned int>(heads));
  causal_softmax_kernel<<<grid, kThreads, 0, stream>>>(device_cast(probs), lse, scores, length,
                                                       lse_stride);
  check_launch("attention: causal softmax");
}

void causal_probs(BFloat16* probs, const float* scores, const float* lse, int heads,
                  std::int64_t length, std::int64_t lse_stride, cudaStream_t stream) {
  if (length == 0) return;
  const dim3 grid(static_cast<unsigned int>(length), static_cast<unsigned int>(heads));
  causal_probs_kernel<<<grid, kThreads, 0, stream>>>(device_cast(probs), scores, lse, length,
                                                     lse_stride);
  check_launch("attention: recompute probabilities");
}

void attention_row_dot(float* dot, const BFloat16* dout, const BFloat16* out, int heads,
                       std::int64_t length, int head_dim, cudaStream_t stream) {
  const std::int64_t warps = length * heads;
  if (warps == 0) return;
  row_dot_kernel<<<blocks_for(warps * kWarp, kThreads), kThreads, 0, stream>>>(
      dot, device_cast(dout), device_cast(out), heads, length, head_dim);
  check_launch("attention: rowsum(dO * O)");
}

void attention_dscores(BFloat16* dscores, const BFloat16* probs, const float* dprobs,
                       const float* dot, std::int64_t dot_stride, int heads, std::int64_t length,
                       float scale, cudaStream_t stream) {
  if (length == 0) return;
  const dim3 grid(static_cast<unsigned int>(length), static_cast<unsigned int>(heads));
  dscores_kernel<<<grid, kThreads, 0, stream>>>(device_cast(dscores), device_cast(probs), dprobs,
                                                dot, dot_stride, length, scale);
  check_launch("attention: dS = P (dP - D)");
}

}  // namespace l3::cuda
