// Softmax statistics of a row in one pass (online softmax): a running (max, sum of
// exp(x - max)) per thread, merged across the block. Used where a row of fp32 scores or logits is
// long enough that reading it once less matters (lm_head logits, fallback attention scores).
#pragma once

#include "kernels/cuda/device_utils.cuh"

namespace l3::cuda {

// -inf max: nothing seen yet.
struct SoftmaxStats {
  float max = -INFINITY;
  float sum = 0.0F;

  __device__ __forceinline__ void add(float x) {
    if (x > max) {
      sum = sum * __expf(max - x) + 1.0F;
      max = x;
    } else {
      sum += __expf(x - max);
    }
  }
  __device__ __forceinline__ void merge(SoftmaxStats o) {
    if (o.max == -INFINITY) return;
    if (max == -INFINITY) {
      *this = o;
      return;
    }
    const float m = fmaxf(max, o.max);
    sum = sum * __expf(max - m) + o.sum * __expf(o.max - m);
    max = m;
  }
};

__device__ __forceinline__ SoftmaxStats warp_merge(SoftmaxStats s) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    SoftmaxStats o;
    o.max = __shfl_xor_sync(0xffffffffU, s.max, offset);
    o.sum = __shfl_xor_sync(0xffffffffU, s.sum, offset);
    s.merge(o);
  }
  return s;
}

// The whole block's statistics, in every thread (blockDim.x a multiple of 32).
__device__ __forceinline__ SoftmaxStats block_merge(SoftmaxStats s) {
  __shared__ float maxes[kWarp];
  __shared__ float sums[kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  s = warp_merge(s);
  if (lane == 0) {
    maxes[warp] = s.max;
    sums[warp] = s.sum;
  }
  __syncthreads();
  SoftmaxStats t;
  if (lane < static_cast<int>(blockDim.x) / kWarp) {
    t.max = maxes[lane];
    t.sum = sums[lane];
  }
  return warp_merge(t);
}

}  // namespace l3::cuda
