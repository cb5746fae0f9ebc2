#!/usr/bin/env bash
# Configure (once) and build llama3-hpc into build/ (or $L3_BUILD_DIR).
#   L3_BUILD_DIR=build  L3_CUDA=AUTO|ON|OFF|EMULATED  L3_CUDA_ARCHS="80;90"  L3_JOBS=2
#   L3_TARGETS="llama3-hpc"  scripts/build.sh [cmake args]
#   (EMULATED: the CUDA backend on a CPU emulation, for tests; scripts/test-emulated.sh uses it;
#   L3_TARGETS: only these targets, e.g. the program alone as scripts/demo.sh builds it; default
#   everything: the program, the library, the tests and the benchmarks)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${L3_BUILD_DIR:-$root/build}
args=(-S "$root" -B "$build" -DL3_CUDA="${L3_CUDA:-AUTO}")
[[ -n "${L3_CUDA_ARCHS:-}" ]] && args+=("-DL3_CUDA_ARCHS=${L3_CUDA_ARCHS}")
if [[ ! -f "$build/CMakeCache.txt" || $# -gt 0 || -n "${L3_CUDA_ARCHS:-}" ]]; then
  cmake "${args[@]}" "$@"
fi
targets=()
for target in ${L3_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build" -j "${L3_JOBS:-2}" "${targets[@]}"
