// The row-wise parts of the fused lm_head + cross-entropy: gathering the counted rows' hidden
// states (the host lists them: no selection on the device, nothing read back), and the
// softmax / loss / gradient of one block of logits.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void gather_rows_kernel(bf16* out, const bf16* h, const std::int32_t* rows,
                                   std::int64_t hidden) {
  const std::int64_t r = blockIdx.x;
  const bf16* src = h + static_cast<std::int64_t>(rows[r]) * hidden;
  bf16* dst = out + r * hidden;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

__global__ void scatter_rows_kernel(bf16* h, const bf16* in, const std::int32_t* rows,
                                    std::int64_t hidden) {
  const std::int64_t r = blockIdx.x;
  bf16* dst = h + static_cast<std::int64_t>(rows[r]) * hidden;
  const bf16* src = in + r * hidden;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// One block per row of logits.
__global__ void softmax_cross_entropy_kernel(float* loss, bf16* dlogits, const float* logits,
                                             const std::int32_t* targets, std::int64_t vocab,
                                             float grad_scale) {
  __shared__ float scratch[kWarp];
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  float max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) max = fmaxf(max, z[j]);
  max = block_max(max, scratch);
  float sum = 0.0F;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += __expf(z[j] - max);
  sum = block_sum(sum, scratch);
  const std::int32_t target = targets[row];
  if (threadIdx.x == 0) loss[row] = max + logf(sum) - z[target];
  if (dlogits == nullptr) return;
  const float factor = grad_scale / sum;
  bf16* d = dlogits + row * vocab;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = __expf(z[j] - max) * factor;
    d[j] = to_bf16(j == target ? p - grad_scale : p);
  }
}

}  // namespace

void gather_rows(BFloat16* out, const BFloat16* h, const std::int32_t* rows, std::int64_t count,
                 std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_rows_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      device_cast(out), device_cast(h), rows, hidden);
  check_launch("gather rows");
}

void scatter_rows(BFloat16* h, const BFloat16* in, const std::int32_t* rows, std::int64_t count,
                  std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  scatter_rows_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      device_cast(h), device_cast(in), rows, hidden);
  check_launch("scatter rows");
}

void softmax_cross_entropy(float* loss, BFloat16* dlogits, const float* logits,
                           const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                           float grad_scale, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_cross_entropy_kernel<<<static_cast<unsigned int>(rows), kThreads * 4, 0, stream>>>(
      loss, dlogits == nullptr ? nullptr : device_cast(dlogits), logits, targets, vocab,
      grad_scale);
  check_launch("softmax cross-entropy");
}

}  // namespace l3::cuda
