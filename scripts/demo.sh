#!/usr/bin/env bash
# Quick start: install the dependencies (Debian/Ubuntu), build, and run the built-in demo on
# 2 MPI ranks. Set L3_RANKS to change the rank count.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${L3_BUILD_DIR:-$root/build}
exec mpiexec -n "${L3_RANKS:-2}" "$build/bin/llama3-hpc" demo "$@"
