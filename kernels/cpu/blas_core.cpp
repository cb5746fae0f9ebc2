#include "kernels/cpu/blas_core.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>

namespace l3::kernels::cpu {

namespace {

bool same_name(std::string_view a, std::string_view b) noexcept {
  return std::ranges::equal(a, b, [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

bool has_word(std::string_view text, std::string_view word) noexcept {
  for (std::size_t at = text.find(word); at != std::string_view::npos;
       at = text.find(word, at + 1)) {
    const bool starts = at == 0 || text[at - 1] == ' ';
    const bool ends = at + word.size() == text.size() || text[at + word.size()] == ' ';
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace

CpuFeatures cpu_features() noexcept {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  f.avx512 = __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
             __builtin_cpu_supports("avx512dq") != 0 && __builtin_cpu_supports("avx512vl") != 0;
#endif
  return f;
}

bool generic_blas_core(std::string_view core) noexcept {
  // OpenBLAS's x86 cores (driver/others/dynamic.c) whose kernels stop short of AVX2.
  static constexpr std::array<std::string_view, 22> kGeneric = {
      "Prescott",     "Core2",       "Penryn",    "Dunnington", "Nehalem",    "Atom",
      "Katmai",       "Coppermine",  "Northwood", "Banias",     "Athlon",     "Opteron",
      "Opteron_SSE3", "Barcelona",   "Bobcat",    "Bulldozer",  "Piledriver", "Steamroller",
      "Excavator",    "Sandybridge", "Generic",   "Unknown"};
  return std::ranges::any_of(kGeneric, [&](std::string_view g) { return same_name(core, g); });
}

std::string blas_core_warning(std::string_view core, std::string_view config, CpuFeatures features,
                              std::string_view requested) {
  if (!generic_blas_core(core) || !features.avx2) return {};
  const std::string_view better = features.avx512 ? "SkylakeX" : "Haswell";
  const std::string_view what = features.avx512 ? "AVX-512" : "AVX2";
  if (!has_word(config, "DYNAMIC_ARCH")) {
    return fmt::format(
        "OpenBLAS runs its generic {} kernels on a CPU with {}: GEMMs run at a fraction of the "
        "CPU's speed; this OpenBLAS was built for one core only, so rebuild it for this CPU "
        "(TARGET={} or DYNAMIC_ARCH=1)",
        core, what, better == "SkylakeX" ? "SKYLAKEX" : "HASWELL");
  }
  const std::string why =
      requested.empty() ? std::string("OpenBLAS picked its generic")
                        : fmt::format("OPENBLAS_CORETYPE={} selects OpenBLAS's generic", requested);
  return fmt::format(
      "{} {} kernels on a CPU with {}{}: GEMMs run at a fraction of the CPU's speed; set "
      "OPENBLAS_CORETYPE={} (docs/HPC.md)",
      why, core, what, requested.empty() ? " (this OpenBLAS does not know the CPU's model)" : "",
      better);
}

BlasCore openblas_core() {
  BlasCore b;
  const char* name = openblas_get_corename();
  const char* config = openblas_get_config();
  b.name = name != nullptr ? name : "unknown";
  b.config = config != nullptr ? config : "";
  while (!b.config.empty() && std::isspace(static_cast<unsigned char>(b.config.back())) != 0) {
    b.config.pop_back();
  }
  const char* requested = std::getenv("OPENBLAS_CORETYPE");
  b.warning =
      blas_core_warning(b.name, b.config, cpu_features(), requested != nullptr ? requested : "");
  return b;
}

}  // namespace l3::kernels::cpu
