// Every CUDA, cuBLAS and cuDNN call is checked; a failure becomes an internal Error naming the
// call, the operation and its shape, and the library's own explanation.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string_view>

namespace l3::cuda {

void check(cudaError_t status, std::string_view what);
void check(cublasStatus_t status, std::string_view what);
void check(cudnnStatus_t status, std::string_view what);

// The error of the last kernel launch (launches do not return one).
void check_launch(std::string_view kernel);

}  // namespace l3::cuda
