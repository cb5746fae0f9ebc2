#include "kernels/cuda/device_memory.hpp"

#include <fmt/format.h>

#include "kernels/cuda/cuda_check.hpp"

namespace l3::cuda {

namespace {
void free_device(void* p) noexcept { cudaFree(p); }
}  // namespace

kernels::Buffer allocate_device(kernels::DType dtype, std::int64_t numel) {
  const std::size_t bytes = static_cast<std::size_t>(numel) * kernels::dtype_size(dtype);
  void* data = nullptr;
  check(cudaMalloc(&data, bytes == 0 ? 256 : bytes),
        fmt::format("cudaMalloc of {} bytes ({} x {})", bytes, numel, kernels::dtype_name(dtype)));
  kernels::Buffer buffer(data, dtype, numel, free_device);  // owns it from here on
  // cudaMemset of device memory returns before it is done and runs on the legacy default stream,
  // which the backend's streams (cudaStreamNonBlocking) do not wait for: without the
  // synchronisation, work queued next on those streams could run first and be zeroed after.
  check(cudaMemset(data, 0, bytes == 0 ? 256 : bytes), "cudaMemset of a new buffer");
  check(cudaStreamSynchronize(nullptr), "zeroing a new buffer");
  return buffer;
}

bool is_device_pointer(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on old drivers
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace l3::cuda
