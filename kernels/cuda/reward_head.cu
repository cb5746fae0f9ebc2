// The reward score read-out (one dot product per selected row) and its gradient, and the
// Bradley-Terry loss on the scores (on the device, so that a training step reads nothing back).
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void gather_dot_kernel(float* scores, const bf16* h, const bf16* w,
                                  const std::int32_t* rows, std::int64_t hidden) {
  __shared__ float scratch[kWarp];
  const bf16* hr = h + static_cast<std::int64_t>(rows[blockIdx.x]) * hidden;
  float sum = 0.0F;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    sum += to_float(hr[i]) * to_float(w[i]);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) scores[blockIdx.x] = sum;
}

// One thread per column, the scores in order: deterministic, and repeated rows add up.
template <typename Grad>  // bf16 or float
__global__ void gather_dot_backward_kernel(bf16* dh, Grad* dw, const float* dscores, const bf16* h,
                                           const bf16* w, const std::int32_t* rows,
                                           std::int64_t count, std::int64_t hidden) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= hidden) return;
  const float wc = to_float(w[c]);
  float dwc = 0.0F;
  for (std::int64_t p = 0; p < count; ++p) {
    const std::int64_t at = static_cast<std::int64_t>(rows[p]) * hidden + c;
    dh[at] = to_bf16(to_float(dh[at]) + dscores[p] * wc);
    dwc += dscores[p] * to_float(h[at]);
  }
  add_to(dw[c], dwc);
}

// log(1 + exp(x)) without overflow, and the logistic function, as the CPU reference computes them
__device__ double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
__device__ double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

// One block: each thread takes pairs tid, tid + blockDim.x, ...; the block then sums in a fixed
// tree, so that the same scores give the same sums bit for bit.
__global__ void bradley_terry_kernel(double* sums, float* d_scores, const float* scores,
                                     const float* margins, std::int64_t pairs, double center,
                                     float grad_scale) {
  __shared__ double scratch[kWarp];
  double loss = 0.0;
  double correct = 0.0;
  double margin = 0.0;
  for (std::int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const double c = scores[p];
    const double r = scores[pairs + p];
    const double z = c - r - (margins == nullptr ? 0.0 : static_cast<double>(margins[p]));
    const double sum = c + r;
    loss += softplus(-z) + center * sum * sum;
    margin += c - r;
    if (c > r) correct += 1.0;
    if (d_scores != nullptr) {
      const double dz = -sigmoid(-z);  // d softplus(-z) / dz
      const double centering = 2.0 * center * sum;
      d_scores[p] = static_cast<float>(grad_scale * (dz + centering));
      d_scores[pairs + p] = static_cast<float>(grad_scale * (-dz + centering));
    }
  }
  loss = block_sum(loss, scratch);
  correct = block_sum(correct, scratch);
  margin = block_sum(margin, scratch);
  if (threadIdx.x == 0) {
    sums[0] += loss;
    sums[1] += correct;
    sums[2] += margin;
  }
}

}  // namespace

void bradley_terry(double* sums, float* d_scores, const float* scores, const float* margins,
                   std::int64_t pairs, double center, float grad_scale, cudaStream_t stream) {
  if (pairs == 0) return;
  bradley_terry_kernel<<<1, kThreads, 0, stream>>>(sums, d_scores, scores, margins, pairs, center,
                                                   grad_scale);
  check_launch("Bradley-Terry loss");
}

void gather_dot(float* scores, const BFloat16* h, const BFloat16* w, const std::int32_t* rows,
                std::int64_t count, std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_dot_kernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(
      scores, device_cast(h), device_cast(w), rows, hidden);
  check_launch("score read-out");
}

namespace {

template <typename Grad>
void gather_dot_backward_into(BFloat16* dh, Grad* dw, const float* dscores, const BFloat16* h,
                              const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                              std::int64_t hidden, cudaStream_t stream) {
  if (count == 0) return;
  gather_dot_backward_kernel<<<blocks_for(hidden, kThreads), kThreads, 0, stream>>>(
      device_cast(dh), device_cast(dw), dscores, device_cast(h), device_cast(w), rows, count,
      hidden);
  check_launch("score read-out backward");
}

}  // namespace

void gather_dot_backward(BFloat16* dh, BFloat16* dw, const float* dscores, const BFloat16* h,
                         const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                         std::int64_t hidden, cudaStream_t stream) {
  gather_dot_backward_into(dh, dw, dscores, h, w, rows, count, hidden, stream);
}
void gather_dot_backward(BFloat16* dh, float* dw, const float* dscores, const BFloat16* h,
                         const BFloat16* w, const std::int32_t* rows, std::int64_t count,
                         std::int64_t hidden, cudaStream_t stream) {
  gather_dot_backward_into(dh, dw, dscores, h, w, rows, count, hidden, stream);
}

}  // namespace l3::cuda
