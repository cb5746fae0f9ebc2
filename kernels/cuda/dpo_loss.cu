// Sequences' log-probabilities from the counted rows' cross-entropies, and the DPO loss on them
// (kernels/ops.hpp, DpoLossArgs), on the device so that a training step reads nothing back. Every
// sum is taken in a fixed order in fp64: a sequence's rows one after the other by one thread (as
// the CPU reference, kernels/cpu/dpo_loss.cpp), the pairs by one block's fixed tree.
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

// A sequence's counted rows [begin, end), clipped to [0, rows): a bad range reads and writes
// nothing outside the arrays.
struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

__device__ Range range_at(const std::int32_t* ranges, std::int64_t s, std::int64_t rows) {
  const std::int64_t begin = ranges[2 * s];
  const std::int64_t end = ranges[2 * s + 1];
  Range r;
  r.begin = begin < 0 ? 0 : (begin > rows ? rows : begin);
  r.end = end < r.begin ? r.begin : (end > rows ? rows : end);
  return r;
}

// -(sum of the rows' losses) in row order, divided by the row count when `mean` (as the CPU's
// log_prob, operation for operation).
__device__ double log_prob(const float* row_loss, Range r, bool mean) {
  double sum = 0.0;
  for (std::int64_t i = r.begin; i < r.end; ++i) sum -= static_cast<double>(row_loss[i]);
  const auto count = static_cast<std::int32_t>(r.end - r.begin);
  return mean && count > 0 ? sum / count : sum;
}

// log(sigmoid(x)) without overflow, and the logistic function, as the CPU reference computes them
__device__ double log_sigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }
__device__ double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

// The gradient of every row of a sequence: grad_scale * d loss / d row_loss, given
// d loss / d logp (the log-probability is minus the rows' sum, or their mean).
__device__ float row_gradient(Range r, double d_logp, bool mean, float grad_scale) {
  const auto count = static_cast<std::int32_t>(r.end - r.begin);
  const double per_row = -d_logp / (mean && count > 0 ? count : 1);
  return static_cast<float>(grad_scale * per_row);
}

// One thread per sequence.
__global__ void sequence_log_probs_kernel(double* logps, const float* row_loss, std::int64_t rows,
                                          const std::int32_t* ranges, std::int64_t sequences,
                                          bool mean) {
  const std::int64_t s = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (s >= sequences) return;
  logps[s] = log_prob(row_loss, range_at(ranges, s, rows), mean);
}

// One block of kThreads. The pairs are taken kThreads at a time, pair base + t by thread t (so
// each thread's partial sums are over pairs t, t + kThreads, ...; the block then sums them in a
// fixed tree). With d_rows: zeroed first, then each chunk's gradients go through shared memory
// and are written sequence after sequence (chosen, rejected, next pair), a barrier between two
// sequences: rows of two overlapping ranges end as the CPU reference leaves them (the last
// writer's value), and every run writes the same values.
__global__ void dpo_loss_kernel(double* sums, float* d_rows, const float* row_loss,
                                std::int64_t rows, const std::int32_t* ranges,
                                const double* reference, std::int64_t pairs, double beta,
                                double label_smoothing, bool ipo, float grad_scale) {
  __shared__ double scratch[kWarp];
  __shared__ float grads[2 * kThreads];  // this chunk's chosen, then rejected row gradients
  const bool mean = ipo;                 // IPO compares per-token means
  if (d_rows != nullptr) {
    for (std::int64_t i = threadIdx.x; i < rows; i += blockDim.x) d_rows[i] = 0.0F;
    __syncthreads();
  }
  double loss_sum = 0.0;
  double correct = 0.0;
  double margin = 0.0;
  double chosen_sum = 0.0;
  for (std::int64_t base = 0; base < pairs; base += blockDim.x) {
    const std::int64_t p = base + threadIdx.x;
    if (p < pairs) {
      const Range c = range_at(ranges, p, rows);
      const Range r = range_at(ranges, pairs + p, rows);
      const double chosen = log_prob(row_loss, c, mean) - reference[p];
      const double rejected = log_prob(row_loss, r, mean) - reference[pairs + p];
      const double h = chosen - rejected;
      double loss = 0.0;
      double dh = 0.0;  // d loss / d h
      if (ipo) {
        const double e = h - 1.0 / (2.0 * beta);
        loss = e * e;
        dh = 2.0 * e;
      } else {
        const double z = beta * h;
        loss = -(1.0 - label_smoothing) * log_sigmoid(z) - label_smoothing * log_sigmoid(-z);
        dh = beta * (-(1.0 - label_smoothing) * sigmoid(-z) + label_smoothing * sigmoid(z));
      }
      const double chosen_reward = beta * chosen;
      const double rejected_reward = beta * rejected;
      loss_sum += loss;
      if (chosen_reward > rejected_reward) correct += 1.0;
      margin += chosen_reward - rejected_reward;
      chosen_sum += chosen_reward;
      if (d_rows != nullptr) {
        grads[threadIdx.x] = row_gradient(c, dh, mean, grad_scale);
        grads[kThreads + threadIdx.x] = row_gradient(r, -dh, mean, grad_scale);
      }
    }
    if (d_rows == nullptr) continue;  // the same for every thread of the block
    __syncthreads();
    const std::int64_t chunk = pairs - base < blockDim.x ? pairs - base : blockDim.x;
    for (std::int64_t q = 0; q < chunk; ++q) {
      for (int side = 0; side < 2; ++side) {
        const Range range = range_at(ranges, side * pairs + base + q, rows);
        const float g = grads[side * kThreads + q];
        for (std::int64_t i = range.begin + threadIdx.x; i < range.end; i += blockDim.x)
          d_rows[i] = g;
        __syncthreads();  // the next sequence's rows may overlap; `grads` is rewritten next chunk
      }
    }
  }
  loss_sum = block_sum(loss_sum, scratch);
  correct = block_sum(correct, scratch);
  margin = block_sum(margin, scratch);
  chosen_sum = block_sum(chosen_sum, scratch);
  if (threadIdx.x == 0) {
    sums[0] += loss_sum;
    sums[1] += correct;
    sums[2] += margin;
    sums[3] += chosen_sum;
  }
}

}  // namespace

void sequence_log_probs(double* logps, const float* row_loss, std::int64_t rows,
                        const std::int32_t* ranges, std::int64_t sequences, bool mean,
                        cudaStream_t stream) {
  if (sequences == 0) return;
  sequence_log_probs_kernel<<<blocks_for(sequences, kThreads), kThreads, 0, stream>>>(
      logps, row_loss, rows, ranges, sequences, mean);
  check_launch("sequence log-probabilities");
}

void dpo_loss(double* sums, float* d_rows, const float* row_loss, std::int64_t rows,
              const std::int32_t* ranges, const double* reference, std::int64_t pairs, double beta,
              double label_smoothing, kernels::PreferenceLoss loss, float grad_scale,
              cudaStream_t stream) {
  if (pairs == 0 && (d_rows == nullptr || rows == 0)) return;
  dpo_loss_kernel<<<1, kThreads, 0, stream>>>(sums, d_rows, row_loss, rows, ranges, reference,
                                              pairs, beta, label_smoothing,
                                              loss == kernels::PreferenceLoss::ipo, grad_scale);
  check_launch("DPO loss");
}

}  // namespace l3::cuda
