// The CUDA toolchain produced code this GPU can run: a kernel writes, the host checks.
// Exits 77 (ctest SKIP_RETURN_CODE) with a SKIP line when there is no usable device, so it
// never fails for lack of a GPU and never passes without running.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

namespace {

constexpr int kSkip = 77;

__global__ void affine_fill(int* out, int n, int scale, int offset) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = scale * i + offset;
}

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "FAILED: %s: %s (%s)\n", what, cudaGetErrorName(status),
               cudaGetErrorString(status));
  return false;
}

}  // namespace

int main() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices visible");
    return kSkip;
  }
  cudaDeviceProp prop{};
  if (!ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  std::printf("device 0: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);

  constexpr int n = 1 << 20;
  int* device = nullptr;
  if (!ok(cudaMalloc(&device, n * sizeof(int)), "cudaMalloc")) return 1;
  if (!ok(cudaMemset(device, 0xff, n * sizeof(int)), "cudaMemset")) return 1;  // poison
  affine_fill<<<(n + 255) / 256, 256>>>(device, n, 3, 7);
  if (!ok(cudaGetLastError(), "kernel launch (is this GPU in L3_CUDA_ARCHS?)")) return 1;
  std::vector<int> host(n);
  if (!ok(cudaMemcpy(host.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy")) {
    return 1;
  }
  cudaFree(device);
  for (int i = 0; i < n; ++i) {
    if (host[static_cast<std::size_t>(i)] != 3 * i + 7) {
      std::fprintf(stderr, "FAILED: element %d is %d, expected %d\n", i,
                   host[static_cast<std::size_t>(i)], 3 * i + 7);
      return 1;
    }
  }
  std::printf("PASS: kernel results verified on %d elements\n", n);
  return 0;
}
