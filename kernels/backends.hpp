// Which compute backends this build has and what they can see at run time.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.hpp"

namespace l3::kernels {

struct BackendReport {
  Backend backend = Backend::cpu;  // its name: backend_name() (backend_options.hpp)
  bool compiled = false;
  bool usable = false;  // compiled and (for cuda) at least one device visible
  std::string summary;  // one line for humans: versions, devices, or why it is unusable
  std::string warning;  // empty, or one line: it runs, but far below what it could (cpu/blas_core)
};

// Every backend known to the program, compiled or not.
[[nodiscard]] std::vector<BackendReport> describe_backends();

// CUDA devices visible to this process; 0 when the CUDA backend is not compiled in or no
// driver/device is present.
[[nodiscard]] int visible_cuda_devices() noexcept;

// Dense bf16 tensor-core peak (TFLOP/s) of the CUDA device `local_rank` would use, for MFU:
// known data-centre GPUs by name; 0 when unknown or on the CPU backend.
[[nodiscard]] double default_peak_tflops(Backend backend, int local_rank);

// CUDA attention: the fallback (cuBLAS GEMMs + softmax kernels) or cuDNN's fused flash
// attention where it supports the shape (the fallback elsewhere).
enum class Attention : std::uint8_t { fallback, cudnn };

struct BackendOptions {
  int device = -1;  // CUDA device; -1: local_rank modulo the visible devices
  Attention attention = Attention::fallback;
  bool deterministic = false;  // kernels that give the same bits run after run
};
// The backend a run computes on (Backend::automatic: cuda when compiled in and a device is
// visible, else cpu). CUDA ranks of a node take devices round-robin by `local_rank`.
// usage Error for a backend that is not usable here, a device that is not visible, or cuDNN
// attention on the CPU.
[[nodiscard]] std::unique_ptr<Ops> make_ops(Backend backend, int local_rank,
                                            const BackendOptions& options = {});

}  // namespace l3::kernels
