// Device-side helpers shared by the kernels: bf16 conversion, 16-byte vector access, warp and
// block reductions, launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/tensor.hpp"

namespace l3::cuda {

using bf16 = __nv_bfloat16;

// Host code holds bf16 as kernels::BFloat16 (same 16 bits); kernels see __nv_bfloat16.
inline bf16* device_cast(kernels::BFloat16* p) { return reinterpret_cast<bf16*>(p); }
inline const bf16* device_cast(const kernels::BFloat16* p) {
  return reinterpret_cast<const bf16*>(p);
}
inline float* device_cast(float* p) { return p; }

constexpr int kWarp = 32;

__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ bf16 to_bf16(float x) {
  return __float2bfloat16(x);
}  // round to nearest

// Adds a sum into a weight gradient: a bf16 element is rounded once per addition, an fp32 one
// (--grad-accum-dtype fp32) not at all.
__device__ __forceinline__ void add_to(bf16& target, float v) {
  target = to_bf16(to_float(target) + v);
}
__device__ __forceinline__ void add_to(float& target, float v) { target += v; }

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffU, v, offset);
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffU, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order; every thread
// gets the result. `scratch` holds 32 values of shared memory; the function synchronises the
// block. T: float or double.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? scratch[lane] : T{0};
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// Eight bf16 values in one 16-byte load/store (the row pointer must be 16-byte aligned and the
// row length a multiple of 8; the kernels check and fall back to scalar access otherwise).
struct alignas(16) Bf16x8 {
  bf16 v[8];
};

// Four bf16 values in one 8-byte access (next to a float4 of fp32 values).
struct alignas(8) Bf16x4 {
  bf16 v[4];
};

// Whether every pointer can be read and written as Bf16x8 (16-byte aligned).
template <typename... Pointers>
inline bool aligned16(const Pointers*... pointers) {
  return ((reinterpret_cast<std::uintptr_t>(pointers) % 16U == 0U) && ...);
}

inline unsigned int blocks_for(std::int64_t n, int threads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

}  // namespace l3::cuda
