#!/usr/bin/env bash
# Here (a build machine without a GPU): build the CUDA backend for sm_90 and pack the GPU test
# and benchmark executables, with the libraries a bare GPU node lacks, into .gpubundle/.
#   tools/gpu-bundle.sh            then on the GPU node: bash .gpubundle/run.sh bash tools/gpu-check.sh OUTDIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${L3_GPU_BUILD_DIR:-$root/build-gpu}
bundler=${L3_BUNDLER:-$root/../shared/device/bundle.sh}
cmake -S "$root" -B "$build" -DL3_CUDA=ON -DL3_CUDA_ARCHS="${L3_CUDA_ARCHS:-90}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "${L3_JOBS:-2}" --target l3_gpu_tests l3_gpu_zero2_test \
  l3_gpu_device_smoke_test l3-bench-gpu l3-bench-train-throughput l3-bench-lora l3-bench-generate \
  l3-bench-grpo llama3-hpc
[[ -x "$bundler" ]] || { echo "gpu-bundle: no bundler at $bundler (set L3_BUNDLER)" >&2; exit 2; }
# (git's own path for it: in a worktree .git is a file)
exclude=$(git -C "$root" rev-parse --git-path info/exclude)
[[ $exclude == /* ]] || exclude=$root/$exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpubundle/' "$exclude" 2>/dev/null || echo '/.gpubundle/' >>"$exclude"
# MPICH's launcher too (the GPU node has no MPI): the two-rank training checks use it.
launcher=()
for exe in mpiexec.hydra hydra_pmi_proxy; do
  path=$(command -v "$exe") && launcher+=("$path")
done
"$bundler" "$root/.gpubundle" "$build/tests/l3_gpu_tests" "$build/tests/l3_gpu_zero2_test" \
  "$build/tests/l3_gpu_device_smoke_test" \
  "$build/bin/l3-bench-gpu" "$build/bin/l3-bench-train-throughput" "$build/bin/l3-bench-lora" \
  "$build/bin/l3-bench-generate" "$build/bin/l3-bench-grpo" \
  "$build/bin/llama3-hpc" \
  "${launcher[@]}"
