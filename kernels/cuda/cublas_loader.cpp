// cuBLAS and cuBLASLt, loaded by dlopen on the first call (see cublas_loader.hpp for why).
// Each function the backend calls is defined here under cuBLAS's own name and signature (the
// headers' declarations give it C linkage) and forwards to the library's, resolved once.
#include "kernels/cuda/cublas_loader.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <bit>
#include <filesystem>
#include <mutex>
#include <type_traits>

#include "core/error.hpp"

#define L3_CUBLAS_SONAME_(name, major) "lib" name ".so." #major
#define L3_CUBLAS_SONAME(name, major) L3_CUBLAS_SONAME_(name, major)

namespace l3::cuda {
namespace {

// One shared library, opened on first use. Process-wide like the dynamic loader itself; it never
// changes after the load, so sessions sharing a process share it safely.
class SharedLibrary {
 public:
  explicit SharedLibrary(const char* soname) : soname_(soname) {}

  void* symbol(const char* name) {
    std::call_once(once_, [this] { load(); });
    if (handle_ == nullptr) {
      throw core::usage_error(fmt::format(
          "the CUDA backend needs cuBLAS, but {} could not be loaded ({}): put the CUDA "
          "toolkit's library directory on LD_LIBRARY_PATH",
          soname_, error_));
    }
    dlerror();
    void* address = dlsym(handle_, name);
    if (address == nullptr) {
      const char* why = dlerror();
      throw core::internal_error(
          fmt::format("{} has no {} ({})", soname_, name, why != nullptr ? why : "null symbol"));
    }
    return address;
  }

  [[nodiscard]] bool loaded() const noexcept { return loaded_.load(); }

 private:
  void load() {
    handle_ = dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      error_ = dlerror();
      // Next to the CUDA runtime this program was linked with, where the toolkit installs cuBLAS
      // (found by the program's run path, which names the runtime's directory).
      Dl_info info{};
      if (dladdr(std::bit_cast<void*>(&cudaRuntimeGetVersion), &info) != 0 &&
          info.dli_fname != nullptr) {
        const std::filesystem::path beside =
            std::filesystem::path(info.dli_fname).parent_path() / soname_;
        handle_ = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle_ == nullptr) error_ += fmt::format("; {}", dlerror());
      }
    }
    loaded_.store(handle_ != nullptr);
  }

  const char* soname_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
  std::atomic<bool> loaded_{false};
};

SharedLibrary& cublas_lt() {
  static SharedLibrary library(L3_CUBLAS_SONAME("cublasLt", CUBLAS_VER_MAJOR));
  return library;
}

SharedLibrary& cublas() {
  static SharedLibrary library(L3_CUBLAS_SONAME("cublas", CUBLAS_VER_MAJOR));
  return library;
}

// The functions forwarded below, by library.
struct Forwarded {
  SharedLibrary& (*library)();
  const char* name;
};
constexpr std::array kForwarded = {
    Forwarded{cublas_lt, "cublasLtCreate"},
    Forwarded{cublas_lt, "cublasLtDestroy"},
    Forwarded{cublas_lt, "cublasLtGetVersion"},
    Forwarded{cublas_lt, "cublasLtMatmul"},
    Forwarded{cublas_lt, "cublasLtMatmulAlgoGetHeuristic"},
    Forwarded{cublas_lt, "cublasLtMatmulDescCreate"},
    Forwarded{cublas_lt, "cublasLtMatmulDescDestroy"},
    Forwarded{cublas_lt, "cublasLtMatmulDescSetAttribute"},
    Forwarded{cublas_lt, "cublasLtMatmulPreferenceCreate"},
    Forwarded{cublas_lt, "cublasLtMatmulPreferenceDestroy"},
    Forwarded{cublas_lt, "cublasLtMatmulPreferenceSetAttribute"},
    Forwarded{cublas_lt, "cublasLtMatrixLayoutCreate"},
    Forwarded{cublas_lt, "cublasLtMatrixLayoutDestroy"},
    Forwarded{cublas, "cublasCreate_v2"},
    Forwarded{cublas, "cublasDestroy_v2"},
    Forwarded{cublas, "cublasSetStream_v2"},
    Forwarded{cublas, "cublasSetMathMode"},
    Forwarded{cublas, "cublasGemmStridedBatchedEx"},
    Forwarded{cublas, "cublasGetStatusName"},
    Forwarded{cublas, "cublasGetStatusString"},
};

}  // namespace

// Calls `Function`'s namesake in `library`, resolved on the first call.
template <auto& Function, class... Args>
auto forward(SharedLibrary& (*library)(), const char* name, Args... args) {
  using Pointer = std::add_pointer_t<std::remove_reference_t<decltype(Function)>>;
  static const Pointer real = std::bit_cast<Pointer>(library().symbol(name));
  return real(args...);
}

std::vector<std::string> missing_cublas_symbols() {
  std::vector<std::string> missing;
  for (const Forwarded& f : kForwarded) {
    try {
      (void)f.library().symbol(f.name);
    } catch (const core::Error& e) {
      if (e.kind() == core::ErrorKind::usage) throw;
      missing.push_back(e.what());
    }
  }
  return missing;
}

bool cublas_loaded() noexcept { return cublas_lt().loaded() || cublas().loaded(); }

}  // namespace l3::cuda

using l3::cuda::cublas;
using l3::cuda::cublas_lt;
using l3::cuda::forward;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  return forward<cublasLtCreate>(cublas_lt, "cublasLtCreate", handle);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  return forward<cublasLtDestroy>(cublas_lt, "cublasLtDestroy", handle);
}

size_t cublasLtGetVersion() { return forward<cublasLtGetVersion>(cublas_lt, "cublasLtGetVersion"); }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  return forward<cublasLtMatmul>(cublas_lt, "cublasLtMatmul", handle, desc, alpha, a, a_desc, b,
                                 b_desc, beta, c, c_desc, d, d_desc, algo, workspace,
                                 workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
    cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  return forward<cublasLtMatmulAlgoGetHeuristic>(cublas_lt, "cublasLtMatmulAlgoGetHeuristic",
                                                 handle, desc, a_desc, b_desc, c_desc, d_desc,
                                                 preference, requested, results, returned);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  return forward<cublasLtMatmulDescCreate>(cublas_lt, "cublasLtMatmulDescCreate", desc, compute,
                                           scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return forward<cublasLtMatmulDescDestroy>(cublas_lt, "cublasLtMatmulDescDestroy", desc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
  return forward<cublasLtMatmulDescSetAttribute>(cublas_lt, "cublasLtMatmulDescSetAttribute", desc,
                                                 attribute, buffer, bytes);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  return forward<cublasLtMatmulPreferenceCreate>(cublas_lt, "cublasLtMatmulPreferenceCreate",
                                                 preference);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  return forward<cublasLtMatmulPreferenceDestroy>(cublas_lt, "cublasLtMatmulPreferenceDestroy",
                                                  preference);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, size_t bytes) {
  return forward<cublasLtMatmulPreferenceSetAttribute>(
      cublas_lt, "cublasLtMatmulPreferenceSetAttribute", preference, attribute, buffer, bytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  return forward<cublasLtMatrixLayoutCreate>(cublas_lt, "cublasLtMatrixLayoutCreate", layout, type,
                                             rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return forward<cublasLtMatrixLayoutDestroy>(cublas_lt, "cublasLtMatrixLayoutDestroy", layout);
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  return forward<cublasCreate_v2>(cublas, "cublasCreate_v2", handle);
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  return forward<cublasDestroy_v2>(cublas, "cublasDestroy_v2", handle);
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  return forward<cublasSetStream_v2>(cublas, "cublasSetStream_v2", handle, stream);
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  return forward<cublasSetMathMode>(cublas, "cublasSetMathMode", handle, mode);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType a_type,
                                          int lda, long long int stride_a, const void* b,
                                          cudaDataType b_type, int ldb, long long int stride_b,
                                          const void* beta, void* c, cudaDataType c_type, int ldc,
                                          long long int stride_c, int batch_count,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  return forward<static_cast<cublasStatus_t (&)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
      cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
      void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t)>(
      cublasGemmStridedBatchedEx)>(cublas, "cublasGemmStridedBatchedEx", handle, transa, transb, m,
                                   n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb, stride_b,
                                   beta, c, c_type, ldc, stride_c, batch_count, compute, algo);
}

const char* cublasGetStatusName(cublasStatus_t status) {
  return forward<cublasGetStatusName>(cublas, "cublasGetStatusName", status);
}

const char* cublasGetStatusString(cublasStatus_t status) {
  return forward<cublasGetStatusString>(cublas, "cublasGetStatusString", status);
}
