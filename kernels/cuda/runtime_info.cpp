#include "kernels/cuda/runtime_info.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fmt/format.h>
#include <nccl.h>

#include "core/error.hpp"

namespace l3::cuda {

RuntimeInfo query_runtime() {
  RuntimeInfo info;
  cudaRuntimeGetVersion(&info.runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  try {  // loads cuBLAS (cublas_loader.hpp): "unavailable" where it cannot be loaded
    info.cublaslt_version = static_cast<int>(cublasLtGetVersion());
  } catch (const core::Error&) {
    info.cublaslt_version = 0;
  }
  info.cudnn_version = static_cast<int>(cudnnGetVersion());
  if (ncclGetVersion(&info.nccl_version) != ncclSuccess) info.nccl_version = 0;

  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.no_device_reason =
        fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return info;
  }
  if (count == 0) info.no_device_reason = "no CUDA device visible";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    info.devices.push_back(
        {i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  return info;
}

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string version_string(int cuda_version) {
  return fmt::format("{}.{}", cuda_version / 1000, cuda_version % 1000 / 10);
}

std::string library_version_string(int library_version) {
  if (library_version == 0) return "unavailable";
  return fmt::format("{}.{}.{}", library_version / 10000, library_version / 100 % 100,
                     library_version % 100);
}

}  // namespace l3::cuda
