// The row-wise parts of the fused lm_head + cross-entropy: selecting the counted positions,
// gathering their hidden states, and the softmax / loss / gradient of one block of logits.
#include <cub/cub.cuh>

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

__global__ void gather_targets_kernel(std::int32_t* out, const std::int32_t* targets,
                                      const std::int32_t* indices, std::int64_t count) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = targets[indices[i]];
}

__global__ void iota_kernel(std::int32_t* out, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<std::int32_t>(i);
}

// The select workspace: the candidate positions 0..n-1, then cub's temporary storage.
std::size_t positions_bytes(std::int64_t n) {
  return (static_cast<std::size_t>(n) * sizeof(std::int32_t) + 255) / 256 * 256;
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

std::size_t select_workspace(std::int64_t n) {
  std::size_t bytes = 0;
  cub::DeviceSelect::Flagged(nullptr, bytes, static_cast<const std::int32_t*>(nullptr),
                             static_cast<const std::uint8_t*>(nullptr),
                             static_cast<std::int32_t*>(nullptr),
                             static_cast<std::int32_t*>(nullptr), static_cast<int>(n));
  return positions_bytes(n) + bytes;
}

void select_counted(std::int32_t* indices, std::int32_t* count, const std::uint8_t* mask,
                    std::int64_t n, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  auto* positions = static_cast<std::int32_t*>(workspace);
  iota_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(positions, n);
  check_launch("select counted positions: iota");
  std::size_t bytes = workspace_bytes - positions_bytes(n);
  check(cub::DeviceSelect::Flagged(static_cast<char*>(workspace) + positions_bytes(n), bytes,
                                   positions, mask, indices, count, static_cast<int>(n), stream),
        "select counted positions");
}

void gather_targets(std::int32_t* out, const std::int32_t* targets, const std::int32_t* indices,
                    std::int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  gather_targets_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(out, targets, indices,
                                                                              count);
  check_launch("gather targets");
}

}  // namespace l3::cuda
