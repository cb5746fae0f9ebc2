// GRPO's clipped surrogate loss on the counted rows (kernels/ops.hpp, PolicyLossArgs), on the
// device so that a training step reads nothing back. One block: thread t takes rows t,
// t + kThreads, ... (sequence-level importance sampling: completions t, t + kThreads, ..., each
// whole, for a sum of its log-ratios in a fixed order) in fp64 and the block sums its partials in
// a fixed tree (the same order every run; not the CPU reference's row order,
// kernels/cpu/policy_loss.cpp, so the sums agree with it to rounding).
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
  v = lane < warps ? scratch[lane] : 0.0;  // the values (differences, ratios) are >= 0
  return warp_max(v);
}

// One thread's partial sums and maxima.
struct Partials {
  double loss = 0.0;
  double kl = 0.0;
  double low = 0.0;
  double high = 0.0;
  double entropy = 0.0;
  double gap = 0.0;  // max |logp - sampled|
  double ratio_sum = 0.0;
  double units = 0.0;
  double rejected = 0.0;
  double ratio_max = 0.0;
  double inverse_min = 0.0;  // max of 1 / (1 + rho): the smallest rho
};

// Row c's old - sampled log-probability (old: the current one, detached, when not given).
__device__ __forceinline__ double log_ratio(const PolicyLossRows& in, std::int64_t c) {
  const double old = in.old_logps == nullptr ? -static_cast<double>(in.row_loss[c])
                                             : static_cast<double>(in.old_logps[c]);
  return old - static_cast<double>(in.sampled_logps[c]);
}

// A unit's raw ratio truncated or masked into [clip_min, clip_max], counted in s.
__device__ __forceinline__ double correct_ratio(double raw, std::int64_t rows,
                                                const PolicyLossParams& p, Partials& s) {
  const bool masking = p.importance_sampling == kernels::ImportanceSampling::token_mask ||
                       p.importance_sampling == kernels::ImportanceSampling::sequence_mask;
  const bool outside = raw < p.clip_min || raw > p.clip_max;
  double r = raw;
  if (masking) {
    if (outside) r = 0.0;
  } else {
    r = r < p.clip_min ? p.clip_min : r;
    r = r > p.clip_max ? p.clip_max : r;
  }
  if (outside) s.rejected += static_cast<double>(rows);
  s.ratio_sum += r;
  s.units += 1.0;
  s.ratio_max = r > s.ratio_max ? r : s.ratio_max;
  const double inverse = 1.0 / (1.0 + r);
  s.inverse_min = inverse > s.inverse_min ? inverse : s.inverse_min;
  return r;
}

// Row c's loss terms with importance-sampling ratio rho, and its d_rows.
__device__ __forceinline__ void policy_row(const PolicyLossRows& in, std::int64_t c, double rho,
                                           const PolicyLossParams& p, float* d_rows, Partials& s) {
  const double low_bound = 1.0 - p.epsilon_low;
  const double high_bound = 1.0 + p.epsilon_high;
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
  s.loss +=
      w * (-(unclipped_term < clipped_term ? unclipped_term : clipped_term) * rho + p.beta * kl);
  s.kl += kl;
  if (low) s.low += 1.0;
  if (high) s.high += 1.0;
  if (in.row_entropy != nullptr) s.entropy += static_cast<double>(in.row_entropy[c]);
  if (in.sampled_logps != nullptr) {
    const double diff = logp - static_cast<double>(in.sampled_logps[c]);
    const double size = diff < 0.0 ? -diff : diff;
    s.gap = size > s.gap ? size : s.gap;
  }
  if (d_rows != nullptr) {
    const double surrogate = low || high ? 0.0 : a * ratio * rho;
    d_rows[c] = static_cast<float>(p.grad_scale * w * (surrogate + p.beta * d_kl));
  }
}

// One block of kThreads: the bound lets the fp64 partials stay in registers (no spills). A
// thread takes units u = t, t + kThreads, ...: rows, or with completion_starts (sequence-level
// importance sampling) whole completions, the sum of their log-ratios in row order.
__global__ void __launch_bounds__(kThreads, 1)
    policy_loss_kernel(double* sums, double* largest, float* d_rows, PolicyLossRows in,
                       std::int64_t count, PolicyLossParams p) {
  __shared__ double scratch[kWarp];
  const bool sampling = p.importance_sampling != kernels::ImportanceSampling::off;
  const bool sequences = in.completion_starts != nullptr;
  const std::int64_t units = sequences ? in.completions : count;
  Partials s;
  for (std::int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    const std::int64_t begin = sequences ? in.completion_starts[u] : u;
    const std::int64_t end = sequences ? in.completion_starts[u + 1] : u + 1;
    double rho = 1.0;
    if (sampling) {
      double sum = 0.0;
      for (std::int64_t c = begin; c < end; ++c) sum += log_ratio(in, c);
      rho = correct_ratio(exp(sum), end - begin, p, s);
    }
    for (std::int64_t c = begin; c < end; ++c) policy_row(in, c, rho, p, d_rows, s);
  }
  const double loss_sum = block_sum(s.loss, scratch);
  const double kl_sum = block_sum(s.kl, scratch);
  const double low_sum = block_sum(s.low, scratch);
  const double high_sum = block_sum(s.high, scratch);
  const double entropy_sum = block_sum(s.entropy, scratch);
  double ratio_sum = 0.0;
  double units_sum = 0.0;
  double rejected_sum = 0.0;
  double ratio_max = 0.0;
  double inverse_min = 0.0;
  if (sampling) {  // the same for every thread
    ratio_sum = block_sum(s.ratio_sum, scratch);
    units_sum = block_sum(s.units, scratch);
    rejected_sum = block_sum(s.rejected, scratch);
    ratio_max = block_max(s.ratio_max, scratch);
    inverse_min = block_max(s.inverse_min, scratch);
  }
  const double gap = largest != nullptr ? block_max(s.gap, scratch) : 0.0;
  if (threadIdx.x == 0) {
    sums[0] += loss_sum;
    sums[1] += kl_sum;
    sums[2] += low_sum;
    sums[3] += high_sum;
    sums[4] += entropy_sum;
    if (sampling) {
      sums[5] += ratio_sum;
      sums[6] += units_sum;
      sums[7] += rejected_sum;
      largest[1] = ratio_max > largest[1] ? ratio_max : largest[1];
      largest[2] = inverse_min > largest[2] ? inverse_min : largest[2];
    }
    if (largest != nullptr) largest[0] = gap > largest[0] ? gap : largest[0];
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
