// cuBLAS loaded on first use (kernels/cuda/cublas_loader.hpp), on a machine without a GPU (the
// CI): nothing loads it before a cuBLAS call, every function the backend forwards exists in the
// toolkit's libraries under the name and library the loader expects, and calls that need no
// device go through to the real library. Real CUDA builds only (the emulation has no loader).
#include "kernels/cuda/cublas_loader.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"

namespace {

std::string mapped_files() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("cuBLAS is loaded on its first call and forwards every function the backend uses",
          "[cublas]") {
  // Catch2 runs this case alone in its process (ctest runs one case per process).
  CHECK_FALSE(l3::cuda::cublas_loaded());
  CHECK(mapped_files().find("libcublas") == std::string::npos);

  const std::vector<std::string> missing = l3::cuda::missing_cublas_symbols();
  for (const std::string& m : missing) INFO(m);
  CHECK(missing.empty());
  CHECK(l3::cuda::cublas_loaded());
  CHECK(mapped_files().find("libcublasLt.so") != std::string::npos);

  // The version of the library loaded is the one compiled against (major), and calls return
  // the real library's answers.
  CHECK(static_cast<int>(cublasLtGetVersion() / 10000) == CUBLAS_VER_MAJOR);
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_SUCCESS)) == "CUBLAS_STATUS_SUCCESS");
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED)).size() > 0);
}
