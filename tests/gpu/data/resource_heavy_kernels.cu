// Kernels for tests/gpu/kernel_resources_test.py's own test (--expect-failures): the first two
// must be rejected, the third must pass. Never built into the library.
namespace l3::cuda {

constexpr int kLive = 96;

// kLive loaded values stay live while every output reads all of them: about 250 registers.
__device__ __forceinline__ void all_pairs(float* out, const float* in, int stride) {
  float value[kLive];
#pragma unroll
  for (int i = 0; i < kLive; ++i) value[i] = in[i * stride + threadIdx.x];
#pragma unroll
  for (int j = 0; j < kLive; ++j) {
    float sum = 0.0F;
#pragma unroll
    for (int i = 0; i < kLive; ++i) sum += value[i] * value[(i + j) % kLive];
    out[j * stride + threadIdx.x] = sum;
  }
}

// Rejected: without launch bounds a block of 1024 threads could not start.
__global__ void register_heavy_kernel(float* out, const float* in, int stride) {
  all_pairs(out, in, stride);
}

// Accepted: declared for at most 256 threads, which the registers allow (8 warps x 32 x 256).
__global__ void __launch_bounds__(256)
    bounded_register_heavy_kernel(float* out, const float* in, int stride) {
  all_pairs(out, in, stride);
}

// Rejected: a per-thread array of 256 floats written and read at run-time indices lives in local
// memory (a stack frame).
__global__ void local_array_kernel(float* out, const float* in, const int* index, int stride) {
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = in[i * stride + threadIdx.x];
  table[index[threadIdx.x] & 255] += 1.0F;
  out[threadIdx.x] = table[index[threadIdx.x + 1] & 255];
}

}  // namespace l3::cuda
