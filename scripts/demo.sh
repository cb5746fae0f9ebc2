#!/usr/bin/env bash
# Quick start: install the dependencies (Debian/Ubuntu), build the program, and run the built-in
# demo on 2 MPI ranks. Set L3_RANKS to change the rank count.
# Only the program is built (scripts/test.sh builds the tests and benchmarks), and the CUDA
# backend only where a GPU is visible or L3_CUDA asks for it: the demo runs on the CPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
build=${L3_BUILD_DIR:-$root/build}
if [[ ! -f "$build/CMakeCache.txt" && -z "${L3_CUDA:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export L3_CUDA=AUTO
  else
    export L3_CUDA=OFF
  fi
fi
L3_TARGETS=llama3-hpc "$root/scripts/build.sh"
exec mpiexec -n "${L3_RANKS:-2}" "$build/bin/llama3-hpc" demo "$@"
