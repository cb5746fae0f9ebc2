// For the mains of GPU tests: without a usable CUDA device, a SKIP line and 77 (ctest's
// SKIP_RETURN_CODE), so that a suite never fails for lack of a GPU and never passes without
// running. Listing the tests (ctest's discovery at build time) needs no GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>

#include "listing.hpp"

namespace l3::test {

// 77 when the tests should be skipped here, else 0.
inline int skip_without_cuda_device(int argc, char** argv) {
  if (listing_tests(argc, argv)) return 0;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return 0;
  std::printf("SKIP: no CUDA device (%s)\n",
              status != cudaSuccess ? cudaGetErrorString(status) : "0 devices visible");
  return 77;
}

}  // namespace l3::test
