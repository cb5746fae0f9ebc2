// Small kernels that probe the CUDA emulation itself (emulation_test.cpp): what it must compute
// like a GPU, and the mistakes it must expose. Compiled only in emulated builds.
#include "kernels/cuda/device_utils.cuh"
#include "probe_kernels.hpp"

namespace l3::emulation_probe {

namespace {

using cuda::kWarp;

__global__ void block_sums_kernel(float* out, const float* in) {
  __shared__ float scratch[kWarp];
  const float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  const float sum = cuda::block_sum(v, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

// The same without a barrier between the shared writes and thread 0's reads.
__global__ void racy_sums_kernel(float* out, const float* in) {
  __shared__ float values[1024];
  values[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  if (threadIdx.x == 0) {
    float sum = 0.0F;
    for (unsigned int i = 0; i < blockDim.x; ++i) sum += values[i];
    out[blockIdx.x] = sum;
  }
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.0F;
}

__global__ void barrier_after_exit_kernel(float* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1.0F;
}

__global__ void shuffle_with_exited_lane_kernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = cuda::warp_sum(1.0F);
}

__global__ void vector_copy_kernel(cuda::Bf16x8* out, const cuda::bf16* in) {
  *out = *reinterpret_cast<const cuda::Bf16x8*>(in);  // a 16-byte load on a GPU
}

__global__ void shuffle_partner_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffU, lane * 10, 3);
}

__global__ void dynamic_shared_kernel(float* out) {
  extern __shared__ float buffer[];
  out[blockIdx.x * blockDim.x + threadIdx.x] = buffer[threadIdx.x];  // never written
}

__global__ void block_order_kernel(int* order, int* counter) {
  if (threadIdx.x == 0) order[blockIdx.x] = (*counter)++;
}

__global__ void indices_kernel(int* out) {
  const unsigned int block = blockIdx.x + gridDim.x * blockIdx.y;
  const unsigned int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned int per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = static_cast<int>(block * 1000 + thread);
}

}  // namespace

void block_sums(float* out, const float* in, int blocks, int threads) {
  block_sums_kernel<<<blocks, threads>>>(out, in);
}
void racy_sums(float* out, const float* in, int blocks, int threads) {
  racy_sums_kernel<<<blocks, threads>>>(out, in);
}
void divergent_barrier(float* out) { divergent_barrier_kernel<<<1, 64>>>(out); }
void barrier_after_exit(float* out) { barrier_after_exit_kernel<<<1, 64>>>(out); }
void shuffle_with_exited_lane(float* out) { shuffle_with_exited_lane_kernel<<<1, 32>>>(out); }
void vector_copy(void* out, const void* in) {
  vector_copy_kernel<<<1, 1>>>(static_cast<cuda::Bf16x8*>(out), static_cast<const cuda::bf16*>(in));
}
void shuffle_partner(int* out, int threads) { shuffle_partner_kernel<<<1, threads>>>(out); }
void dynamic_shared(float* out, int blocks, int threads) {
  dynamic_shared_kernel<<<blocks, threads, threads * sizeof(float)>>>(out);
}
void block_order(int* order, int* counter, int blocks) {
  block_order_kernel<<<blocks, 32>>>(order, counter);
}
void indices(int* out, unsigned int grid_x, unsigned int grid_y, unsigned int bx, unsigned int by,
             unsigned int bz) {
  indices_kernel<<<dim3(grid_x, grid_y), dim3(bx, by, bz)>>>(out);
}

}  // namespace l3::emulation_probe
