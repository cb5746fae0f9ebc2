#include "kernels/cpu/blas_core.hpp"

#include <cstdlib>
#include <string>

#include "catch.hpp"

using l3::kernels::cpu::blas_core_warning;
using l3::kernels::cpu::CpuFeatures;
using l3::kernels::cpu::generic_blas_core;

namespace {
constexpr const char* kDynamic =
    "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP "
    "Prescott MAX_THREADS=64";
constexpr CpuFeatures kAvx512{.avx2 = true, .avx512 = true};
constexpr CpuFeatures kAvx2{.avx2 = true, .avx512 = false};
constexpr CpuFeatures kOld{};
}  // namespace

TEST_CASE("OpenBLAS's fallback cores are generic, its AVX2 and AVX-512 cores are not", "[blas]") {
  for (const char* core :
       {"Prescott", "prescott", "Core2", "Nehalem", "Sandybridge", "Barcelona"}) {
    INFO(core);
    CHECK(generic_blas_core(core));
  }
  for (const char* core : {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen", ""}) {
    INFO(core);
    CHECK_FALSE(generic_blas_core(core));
  }
}

TEST_CASE("a generic OpenBLAS core on an AVX-512 or AVX2 CPU is a warning naming the fix",
          "[blas]") {
  const std::string avx512 = blas_core_warning("Prescott", kDynamic, kAvx512);
  CHECK(avx512.find("Prescott") != std::string::npos);
  CHECK(avx512.find("AVX-512") != std::string::npos);
  CHECK(avx512.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK(avx512.find('\n') == std::string::npos);

  // Chosen by the variable: it says so.
  const std::string chosen = blas_core_warning("Prescott", kDynamic, kAvx512, "Prescott");
  CHECK(chosen.find("OPENBLAS_CORETYPE=Prescott selects") != std::string::npos);
  CHECK(chosen.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);

  const std::string avx2 = blas_core_warning("Core2", kDynamic, kAvx2);
  CHECK(avx2.find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);

  // Without DYNAMIC_ARCH the variable does nothing: the fix is a build for this CPU.
  const std::string fixed = blas_core_warning("Prescott", "OpenBLAS 0.3.21 Prescott", kAvx512);
  CHECK(fixed.find("OPENBLAS_CORETYPE") == std::string::npos);
  CHECK(fixed.find("TARGET=SKYLAKEX") != std::string::npos);
}

TEST_CASE("no warning for a core that fits the CPU, or a CPU without AVX2", "[blas]") {
  CHECK(blas_core_warning("SkylakeX", kDynamic, kAvx512).empty());
  CHECK(blas_core_warning("Haswell", kDynamic, kAvx2).empty());
  CHECK(blas_core_warning("Prescott", kDynamic, kOld).empty());
}

TEST_CASE("the linked OpenBLAS names its core and configuration", "[blas]") {
  const l3::kernels::cpu::BlasCore core = l3::kernels::cpu::openblas_core();
  CHECK_FALSE(core.name.empty());
  CHECK(core.config.find("OpenBLAS") != std::string::npos);
  const char* requested = std::getenv("OPENBLAS_CORETYPE");
  CHECK(core.warning == blas_core_warning(core.name, core.config, l3::kernels::cpu::cpu_features(),
                                          requested != nullptr ? requested : ""));
}
