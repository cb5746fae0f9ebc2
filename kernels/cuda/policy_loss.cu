// GRPO's clipped surrogate loss on the counted rows (kernels/ops.hpp, PolicyLossArgs), on the
// device so that a training step reads nothing back. One block: thread t takes rows t,
// t + kThreads, ... in fp64 and the block sums its partials in a fixed tree (the same order every
// run; not the CPU reference's row order, kernels/cpu/policy_loss.cpp, so the sums agree with it
// to rounding).
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ double warp_max(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const double o = __shfl_xor_sync(0xffffffffU, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

// The block's largest value (blockDim.x a multiple of 32), in every thread; as block_sum.
__device__ double block_max(double v, double* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? scratch[lane] : 0.0;  // the values are absolute differences: >= 0
  return warp_max(v);
}

// One block of kThreads: the bound lets the fp64 partials stay in registers (no spills).
__global__ void __launch_bounds__(kThreads, 1)
    policy_loss_kernel(double* sums, double* largest, float* d_rows, PolicyLossRows in,
                       std::int64_t count, PolicyLossParams p) {
  __shared__ double scratch[kWarp];
  const double low_bound = 1.0 - p.epsilon_low;
  const double high_bound = 1.0 + p.epsilon_high;
  double loss_sum = 0.0;
  double kl_sum = 0.0;
  double low_sum = 0.0;
  double high_sum = 0.0;
  double entropy_sum = 0.0;
  double gap = 0.0;  // max |logp - sampled|
  for (std::int64_t c = threadIdx.x; c < count; c += blockDim.x) {
    const double logp = -static_cast<double>(in.row_loss[c]);
    const double old = in.old_logps == nullptr ? logp : static_cast<double>(in.old_logps[c]);
    const double ratio = exp(logp - old);
    const double above = ratio < low_bound ? low_bound : ratio;
    const double clipped = above > high_bound ? high_bound : above;
    const double a = in.advantages[c];
    const double w = in.weights[c];
    const bool low = ratio < low_bound && a < 0.0;
    const bool high = ratio > high_bound && a > 0.0;
    double kl = 0.0;
    double d_kl = 0.0;  // d kl / d row_loss = exp(ref - logp) - 1
    if (in.ref_row_loss != nullptr) {
      const double delta = -static_cast<double>(in.ref_row_loss[c]) - logp;
      const double e = exp(delta);
      kl = e - delta - 1.0;
      d_kl = e - 1.0;
    }
    const double unclipped_term = ratio * a;
    const double clipped_term = clipped * a;
    loss_sum +=
        w * (-(unclipped_term < clipped_term ? unclipped_term : clipped_term) + p.beta * kl);
    kl_sum += kl;
    if (low) low_sum += 1.0;
    if (high) high_sum += 1.0;
    if (in.row_entropy != nullptr) entropy_sum += static_cast<double>(in.row_entropy[c]);
    if (in.sampled_logps != nullptr) {
      const double diff = logp - static_cast<double>(in.sampled_logps[c]);
      const double size = diff < 0.0 ? -diff : diff;
      gap = size > gap ? size : gap;
    }
    if (d_rows != nullptr) {
      const double surrogate = low || high ? 0.0 : a * ratio;
      d_rows[c] = static_cast<float>(p.grad_scale * w * (surrogate + p.beta * d_kl));
    }
  }
  loss_sum = block_sum(loss_sum, scratch);
  kl_sum = block_sum(kl_sum, scratch);
  low_sum = block_sum(low_sum, scratch);
  high_sum = block_sum(high_sum, scratch);
  entropy_sum = block_sum(entropy_sum, scratch);
  if (largest != nullptr) gap = block_max(gap, scratch);  // the same for every thread
  if (threadIdx.x == 0) {
    sums[0] += loss_sum;
    sums[1] += kl_sum;
    sums[2] += low_sum;
    sums[3] += high_sum;
    sums[4] += entropy_sum;
    if (largest != nullptr) *largest = gap > *largest ? gap : *largest;
  }
}

}  // namespace

void policy_loss(double* sums, double* largest, float* d_rows, const PolicyLossRows& rows,
                 std::int64_t count, const PolicyLossParams& params, cudaStream_t stream) {
  if (count == 0) return;
  policy_loss_kernel<<<1, kThreads, 0, stream>>>(sums, largest, d_rows, rows, count, params);
  check_launch("policy loss");
}

}  // namespace l3::cuda
