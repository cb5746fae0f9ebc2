// main() for GPU tests: without a usable CUDA device every test exits 77 (ctest's
// SKIP_RETURN_CODE) with a SKIP line, so the suite never fails for lack of a GPU and never
// passes without running. Listing the tests (for ctest's discovery at build time) needs no GPU.
#if L3_CATCH2_MAJOR < 3
#define CATCH_CONFIG_RUNNER
#endif
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string_view>

#include "catch.hpp"
#include "listing.hpp"

int main(int argc, char** argv) {
  if (!l3::test::listing_tests(argc, argv)) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      std::printf("SKIP: no CUDA device (%s)\n",
                  status != cudaSuccess ? cudaGetErrorString(status) : "0 devices visible");
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
