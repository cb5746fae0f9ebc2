#!/usr/bin/env bash
# The demo as the README runs it (its default steps, 2 ranks): its GRPO stage raises the exact-
# answer accuracy of greedy completions on the held-out prompts. metrics-grpo.jsonl has an
# evaluation at step 0 and at the last step; the last's "reward" (that accuracy) is the higher,
# and the demo prints both.
#   demo_gain_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-demo-gain-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
if ! timeout -k 5 240 "$mpiexec" -n 2 "$bin" demo --workdir "$work/demo" >"$work/out" 2>"$work/err"; then
  tail -5 "$work/err"
  echo "FAIL: the demo failed"
  exit 1
fi
grep '^  GRPO ' "$work/out"
python3 - "$work/demo/metrics-grpo.jsonl" "$work/out" <<'PY'
import json, re, sys
evals = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"eval"' in l]
assert [e["step"] for e in evals] == [0, 20], [e["step"] for e in evals]
first, last = evals[0]["reward"], evals[-1]["reward"]
assert last > first, (first, last)
printed = re.search(r"held-out prompts ([0-9.]+)% -> ([0-9.]+)%", open(sys.argv[2]).read())
assert printed and abs(float(printed.group(1)) - 100 * first) < 0.06, printed
assert abs(float(printed.group(2)) - 100 * last) < 0.06, printed
print(f"ok: exact answers of greedy completions {100 * first:.1f}% -> {100 * last:.1f}%")
PY
