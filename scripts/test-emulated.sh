#!/usr/bin/env bash
# The GPU tests without a GPU: builds the CUDA backend against the CPU emulation (tests/emulated,
# L3_CUDA=EMULATED) into build-emulated/ (or $L3_EMULATED_BUILD_DIR) and runs the emulation's
# own tests (emulation/...), tests/gpu's op and model tests and the rehearsal of the one-shot
# GPU check (tools/gpu-check.sh) there (label gpu; a few minutes once built).
# They check the backend's logic: kernel indexing, barriers, vector paths and tails, buffer
# carving, call sequences; not the GPU (docs/GPU.md, "Testing without a GPU"). Needs the CUDA,
# cuDNN and NCCL headers (no GPU, no nvcc); skips with a message without them. Extra arguments go
# to ctest. The slow training script runs with: ctest --test-dir build-emulated -L slow
# A first argument --configure-only or --build-only stops after that step (.ci/run times each).
set -euo pipefail
step=all
case "${1:-}" in
  --configure-only) step=configure; shift ;;
  --build-only) step=build; shift ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
build=${L3_EMULATED_BUILD_DIR:-$root/build-emulated}
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
if [[ ! -f "$cuda_include/cuda_runtime_api.h" || ! -f "$cuda_include/cudnn.h" ]]; then
  echo "SKIP: emulated GPU tests need the CUDA and cuDNN headers (not found under $cuda_include)"
  exit 0
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -DL3_CUDA=EMULATED -DL3_BUILD_BENCH=ON
fi
[[ $step == configure ]] && exit 0
targets=(l3_gpu_tests l3_gpu_zero2_test l3_emulation_tests l3_emulated_nccl_test l3_mpi_session_test
  llama3-hpc)
# The benchmarks the GPU check runs, for its rehearsal (gpu/check_rehearsal).
if grep -q '^L3_BUILD_BENCH:BOOL=ON' "$build/CMakeCache.txt"; then
  targets+=(l3-bench-gpu l3-bench-train-throughput l3-bench-lora l3-bench-generate l3-bench-grpo)
fi
cmake --build "$build" -j "${L3_JOBS:-2}" --target "${targets[@]}"
[[ $step == build ]] && exit 0
ctest --test-dir "$build" --output-on-failure -j "${L3_JOBS:-2}" -L gpu -LE slow "$@"
