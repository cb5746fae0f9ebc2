// Which OpenBLAS kernels this process runs: the core OpenBLAS picked for this CPU (or was told
// to use with $OPENBLAS_CORETYPE), and a warning when that core is a generic fallback on a CPU
// that can do much better. OpenBLAS built with DYNAMIC_ARCH picks its kernels at load time by
// CPU model; a model newer than the library (Debian 12's 0.3.21 on Intel Sapphire and Emerald
// Rapids) silently gets the SSE3 "Prescott" kernels, about a quarter of the SGEMM speed of
// "SkylakeX" there. `--version`, `info` and the start of a CPU training run report it.
#pragma once

#include <string>
#include <string_view>

namespace l3::kernels::cpu {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 and FMA: OpenBLAS's Haswell kernels
  bool avx512 = false;  // AVX-512 F, BW, DQ and VL: OpenBLAS's SkylakeX kernels
};

// What this CPU can run (__builtin_cpu_supports).
[[nodiscard]] CpuFeatures cpu_features() noexcept;

struct BlasCore {
  std::string name;     // openblas_get_corename(), e.g. "SkylakeX", "Haswell", "Prescott"
  std::string config;   // openblas_get_config(), e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Haswell"
  std::string warning;  // one line when the core is a generic fallback (blas_core_warning)
};

// The core of the OpenBLAS this process is linked against, on this CPU.
[[nodiscard]] BlasCore openblas_core();

// Whether `core` is one of OpenBLAS's kernels without AVX2 (Prescott, Core2, Nehalem,
// Sandybridge, Barcelona, ...: what it falls back to for a CPU it does not know).
[[nodiscard]] bool generic_blas_core(std::string_view core) noexcept;

// Empty, or one line saying that `core` wastes this CPU and what to set instead:
// OPENBLAS_CORETYPE=SkylakeX with AVX-512, Haswell with AVX2 only; for an OpenBLAS built
// without DYNAMIC_ARCH (`config`), where that variable does nothing, a rebuild for the CPU.
// `requested`: $OPENBLAS_CORETYPE as set (empty when not), named when it chose the core.
[[nodiscard]] std::string blas_core_warning(std::string_view core, std::string_view config,
                                            CpuFeatures features, std::string_view requested = {});

}  // namespace l3::kernels::cpu
