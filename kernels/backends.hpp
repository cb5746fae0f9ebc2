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

// CUDA attention (--attention; docs/GPU.md):
//   automatic   cuDNN's fused flash attention with its deterministic backward where cuDNN
//               serves this GPU (sm_90 with cuDNN >= 9.10.2) and the shape, the fallback
//               elsewhere: bit-identical reruns and restarts (the training default)
//   cudnn       the same, asked for by name: a usage error on the CPU backend, and on a GPU
//               cuDNN does not serve, every call runs on the fallback and the log says why
//   cudnn_nondeterministic  cuDNN with its faster backward, whose dQ sums in an order that
//               varies from run to run: gives up bit-identical reruns and bitwise restart
//   fallback    cuBLAS GEMMs + softmax kernels everywhere (deterministic)
// Where cuDNN declines a shape (or a plan's workspace is over its limit), that call runs on
// the fallback, which is deterministic too.
enum class Attention : std::uint8_t { automatic, cudnn, cudnn_nondeterministic, fallback };

struct BackendOptions {
  int device = -1;  // CUDA device; -1: local_rank modulo the visible devices
  Attention attention = Attention::fallback;  // training runs pass TrainConfig's (auto)
  bool deterministic = false;                 // kernels that give the same bits run after run
};

// What cuDNN attention can do on the GPU a rank uses (cuda::cudnn_attention_unavailable and
// cudnn_deterministic_backward_unavailable): empty strings where it can, else why not.
struct CudnnSupport {
  std::string unavailable;                // cuDNN attention at all
  std::string deterministic_unavailable;  // its deterministic backward
};

// The attention a CUDA backend runs, resolved from --attention, --deterministic and `support`.
struct AttentionChoice {
  bool cudnn = false;                  // cuDNN's fused attention where it takes the shape
  bool deterministic_backward = true;  // cuDNN's deterministic backward (the fallback's always is)
  std::string fallback_reason;         // auto on a GPU cuDNN does not serve: why
};
// Pure. usage Error (one line naming both options) for cudnn-nondeterministic with
// --deterministic.
[[nodiscard]] AttentionChoice choose_attention(Attention attention, bool deterministic,
                                               const CudnnSupport& support);
// One line for the run's log: the attention in use and whether its backward is deterministic.
[[nodiscard]] std::string describe_attention(Attention attention, const AttentionChoice& choice);

// What cuDNN attention can do on the CUDA device `device` (-1: the one `local_rank` would use):
// asked of the device where the CUDA backend is compiled in and a device is visible; elsewhere
// (planning on a machine without a GPU) the answer for an sm_90 GPU with this build's cuDNN.
[[nodiscard]] CudnnSupport cudnn_support(int local_rank, int device = -1);
// choose_attention for the device of `local_rank` (or `device`).
[[nodiscard]] AttentionChoice attention_choice(Attention attention, bool deterministic,
                                               int local_rank, int device = -1);
// The backend a run computes on (Backend::automatic: cuda when compiled in and a device is
// visible, else cpu). CUDA ranks of a node take devices round-robin by `local_rank`.
// usage Error for a backend that is not usable here, a device that is not visible, or cuDNN
// attention on the CPU.
[[nodiscard]] std::unique_ptr<Ops> make_ops(Backend backend, int local_rank,
                                            const BackendOptions& options = {});

}  // namespace l3::kernels
