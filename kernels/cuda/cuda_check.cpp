#include "kernels/cuda/cuda_check.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace l3::cuda {

void check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  throw core::internal_error(
      fmt::format("CUDA {}: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status)));
}

void check(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw core::internal_error(fmt::format("cuBLAS {}: {} ({})", what, cublasGetStatusName(status),
                                         cublasGetStatusString(status)));
}

void check(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw core::internal_error(fmt::format("cuDNN {}: {}", what, cudnnGetErrorString(status)));
}

void check_launch(std::string_view kernel) { check(cudaGetLastError(), kernel); }

}  // namespace l3::cuda
