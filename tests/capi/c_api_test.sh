#!/usr/bin/env bash
# Runs the C API test (c_api_test.c) under mpiexec with a small SFT dataset prepared by the CLI.
#   c_api_test.sh LLAMA3_HPC C_API_TEST MPIEXEC RANKS
set -euo pipefail
bin=$1 test_exe=$2 mpiexec=$3 ranks=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-capi-XXXXXX")
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 40); do
  w="word$((i % 7))"
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "$w" "$(echo "$w" | rev)"
done >"$work/sft.jsonl"
"$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/sft" >/dev/null
OMP_NUM_THREADS=1 "$mpiexec" -n "$ranks" "$test_exe" "$work/sft" "$work"
