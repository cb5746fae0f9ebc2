#include "kernels/backends.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/words.hpp"
#include "kernels/backend_options.hpp"
#include "kernels/cpu/blas_core.hpp"
#include "kernels/cpu/cpu_ops.hpp"

#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/cudnn_attention.hpp"
#include "kernels/cuda/runtime_info.hpp"
#endif

namespace l3::kernels {

namespace {

BackendReport cpu_backend() {
  const int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  const char* threading = parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "sequential";
  const cpu::BlasCore blas = cpu::openblas_core();
  return {
      Backend::cpu, true, true,
      fmt::format("fp32, {}, OpenBLAS {}, OpenBLAS core {}",
                  core::count_of(omp_get_max_threads(), "OpenMP thread"),
                  core::count_of(openblas_get_num_threads(), fmt::format("{} thread", threading)),
                  blas.name),
      blas.warning};
}

BackendReport cuda_backend() {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  const cuda::RuntimeInfo info = cuda::query_runtime();
  std::string devices;
  for (const cuda::DeviceInfo& d : info.devices) {
    devices += fmt::format("{}{}: {} (sm_{}{}, {:.0f} GiB, {} SMs)", devices.empty() ? "" : "; ",
                           d.index, d.name, d.cc_major, d.cc_minor,
                           static_cast<double>(d.memory_bytes) / (1ULL << 30U), d.sm_count);
  }
  if (devices.empty()) devices = "none (" + info.no_device_reason + ")";
  return {Backend::cuda,
          true,
          !info.devices.empty(),
          fmt::format("bf16, compiled for sm {}; CUDA runtime {}, driver {}; cuBLASLt {}, "
                      "cuDNN {}, NCCL {}; devices: {}",
                      core::build_info().cuda_archs, cuda::version_string(info.runtime_version),
                      info.driver_version == 0 ? std::string("none")
                                               : cuda::version_string(info.driver_version),
                      cuda::library_version_string(info.cublaslt_version),
                      cuda::library_version_string(info.cudnn_version),
                      cuda::library_version_string(info.nccl_version), devices),
          {}};
#else
  return {Backend::cuda,
          false,
          false,
          "not compiled in (configure with -DL3_CUDA=ON and a CUDA toolkit)",
          {}};
#endif
}

}  // namespace

std::vector<BackendReport> describe_backends() { return {cpu_backend(), cuda_backend()}; }

int visible_cuda_devices() noexcept {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

double default_peak_tflops(Backend backend, int local_rank) {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  if (backend != Backend::cuda) return 0.0;
  const cuda::RuntimeInfo info = cuda::query_runtime();
  if (info.devices.empty()) return 0.0;
  const std::string& name =
      info.devices[static_cast<std::size_t>(local_rank) % info.devices.size()].name;
  // Dense (no sparsity) bf16 peaks from the vendors' data sheets.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ||
      name.find("GH200") != std::string::npos)
    return 989.0;
  if (name.find("B200") != std::string::npos) return 2250.0;
  if (name.find("A100") != std::string::npos) return 312.0;
  if (name.find("L40S") != std::string::npos) return 362.0;
  return 0.0;
#else
  (void)backend;
  (void)local_rank;
  return 0.0;
#endif
}

CudnnSupport cudnn_support(int local_rank, int device) {
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  // Asked directly (not through cuda::query_runtime, which loads cuBLAS to read its version).
  const std::size_t version = cudnnGetVersion();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: later calls start clean
    count = 0;
  }
  int major = 9;  // no GPU here (planning for GPU nodes): an sm_90 GPU with this cuDNN
  int minor = 0;
  if (count > 0) {
    const int index = device >= 0 && device < count ? device : std::max(local_rank, 0) % count;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
      cudaGetLastError();
      return {
          .unavailable = fmt::format("the compute capability of CUDA device {} is unknown", index),
          .deterministic_unavailable = {}};
    }
  }
  return {
      .unavailable = cuda::cudnn_attention_unavailable(version, major, minor),
      .deterministic_unavailable = cuda::cudnn_deterministic_backward_unavailable(major, minor)};
#else
  (void)local_rank;
  (void)device;
  return {};  // planning for a GPU build: an sm_90 GPU with a recent cuDNN
#endif
}

AttentionChoice attention_choice(Attention attention, bool deterministic, int local_rank,
                                 int device) {
  // Only auto asks the device; the rest (and auto's usage rules) need no CUDA at all.
  if (attention != Attention::automatic) return choose_attention(attention, deterministic, {});
  return choose_attention(attention, deterministic, cudnn_support(local_rank, device));
}

std::unique_ptr<Ops> make_ops(Backend backend, int local_rank, const BackendOptions& options) {
  const int device = options.device;
  const int devices = visible_cuda_devices();
  if (backend == Backend::cpu || (backend == Backend::automatic && devices == 0)) {
    // The CPU backend has one attention; auto and fallback name nothing else.
    if (options.attention == Attention::cudnn ||
        options.attention == Attention::cudnn_nondeterministic) {
      throw core::usage_error(fmt::format("--attention {} needs the CUDA backend (--backend cuda)",
                                          attention_name(options.attention)));
    }
    return std::make_unique<CpuOps>();
  }
#if defined(L3_HAVE_CUDA) && L3_HAVE_CUDA
  if (devices == 0) {
    throw core::usage_error(
        fmt::format("--backend cuda: no usable CUDA device ({})", cuda_backend().summary));
  }
  if (device >= devices) {
    throw core::usage_error(fmt::format("--device {}: this rank sees {} CUDA device{}", device,
                                        devices, devices == 1 ? "" : "s"));
  }
  const AttentionChoice attention =
      attention_choice(options.attention, options.deterministic, local_rank, device);
  return std::make_unique<cuda::CudaOps>(
      cuda::CudaOptions{.device = device >= 0 ? device : local_rank % devices,
                        .cudnn_attention = attention.cudnn,
                        .deterministic = attention.deterministic_backward});
#else
  (void)local_rank;
  (void)device;
  (void)options;
  throw core::usage_error(
      "--backend cuda: this build has no CUDA backend (configure with "
      "-DL3_CUDA=ON)");
#endif
}

}  // namespace l3::kernels
