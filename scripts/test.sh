#!/usr/bin/env bash
# Build if needed, then run the whole test suite (unit, 2- and 4-rank MPI, CLI, GPU, lint).
# GPU tests report SKIP on machines without a GPU. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${L3_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "${L3_JOBS:-2}" "$@"
