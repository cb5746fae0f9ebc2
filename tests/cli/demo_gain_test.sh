#!/usr/bin/env bash
# The demo at its default steps, on 2 ranks as the README runs it and on 1: its GRPO stage
# raises the exact-answer accuracy of greedy completions on the held-out prompts on both (their
# SFT models differ in their last bits). metrics-grpo.jsonl has an evaluation at step 0 and at
# the last step; the last's "reward" (that accuracy) is the higher, and the demo prints both.
# Then the commands its closing hint prints run as written (on a machine without a model
# download: tiny-llama3 and the byte tokenizer), at a test's sizes.
#   demo_gain_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-demo-gain-XXXXXX")
trap 'rm -rf "$work"' EXIT
# 2 ranks of one thread, as the README's scripts/demo.sh on 2 cores; 1 rank with the node's
# cores (its default) and without the DPO stage, which the GRPO stage does not start from.
# CI runs the README's demo (scripts/demo.sh, 2 ranks) before the tests and names its working
# directory in L3_DEMO_RUN, its output beside it (DIR.out): that run is checked here instead of
# a second one (it took 60 s on CI's 2 cores).
demo_run=${L3_DEMO_RUN:-}
demo2_dir=$work/demo-2  # where the 2-rank demo ran: its closing hint names this directory
for ranks in 2 1; do
  extra=()
  threads=1
  if [[ $ranks -eq 1 ]]; then
    extra=(--dpo-steps 0)
    threads=$(nproc)
  elif [[ -n $demo_run && -f $demo_run.out && -f $demo_run/metrics-grpo.jsonl ]] &&
    grep -q '^llama3-hpc demo: done in .* on 2 ranks' "$demo_run.out"; then
    echo "the 2-rank demo: CI's run of scripts/demo.sh in $demo_run (L3_DEMO_RUN)"
    cp -r "$demo_run" "$work/demo-2"
    cp "$demo_run.out" "$work/out-2"
    demo2_dir=$demo_run
  elif [[ -n $demo_run ]]; then
    echo "FAIL: L3_DEMO_RUN=$demo_run is not a finished 2-rank demo (no $demo_run.out saying so, or no metrics-grpo.jsonl)"
    exit 1
  fi
  if [[ ! -f $work/out-$ranks ]] && ! OMP_NUM_THREADS=$threads timeout -k 5 240 "$mpiexec" -n "$ranks" "$bin" demo \
    --workdir "$work/demo-$ranks" "${extra[@]}" >"$work/out-$ranks" 2>"$work/err"; then
    tail -5 "$work/err"
    echo "FAIL: the demo failed on $ranks rank(s)"
    exit 1
  fi
  grep '^  GRPO ' "$work/out-$ranks"
  python3 - "$work/demo-$ranks/metrics-grpo.jsonl" "$work/out-$ranks" "$ranks" <<'PY' || exit 1
import json, re, sys
evals = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"eval"' in l]
assert [e["step"] for e in evals] == [0, 40], [e["step"] for e in evals]
first, last = evals[0]["reward"], evals[-1]["reward"]
assert last > first, (first, last)
printed = re.search(r"held-out prompts ([0-9.]+)% -> ([0-9.]+)%", open(sys.argv[2]).read())
assert printed and abs(float(printed.group(1)) - 100 * first) < 0.06, printed
assert abs(float(printed.group(2)) - 100 * last) < 0.06, printed
print(f"ok: {sys.argv[3]} rank(s): exact answers of greedy completions {100 * first:.1f}% -> {100 * last:.1f}%")
PY
done
cp "$work/out-2" "$work/out"

# The closing hint's commands, as printed (the sizes' line set to a test's, D to the first 40
# of each of the demo's record files): the program on PATH, the demo's records, every phase,
# eval, generate --input, export and report.
mkdir "$work/records"
for f in "$work"/demo-2/input/*.jsonl; do head -40 "$f" >"$work/records/$(basename "$f")"; done
sed -n '/^Next, README.md/,/^See docs/p' "$work/out" | grep '^  ' | sed 's/^  //' |
  sed 's/^SEQ=256 BATCH=8 STEPS=20 .*/SEQ=128 BATCH=4 STEPS=1/' |
  sed "s|^D=.*/${demo2_dir##*/}/input\$|D=$work/records|" >"$work/hint.sh"
grep -q "^D=$work/records\$" "$work/hint.sh" || {
  cat "$work/hint.sh"
  echo "FAIL: the hint's D is not the demo's input directory"
  exit 1
}
grep -q '^SEQ=128 BATCH=4 STEPS=1$' "$work/hint.sh" || {
  cat "$work/hint.sh"
  echo "FAIL: the hint has no 'SEQ=256 BATCH=8 STEPS=20' line to size for a test"
  exit 1
}
for needed in "prep prompts" "grpo " "generate --init ckpt/grpo --input" "export " "report "; do
  grep -q "llama3-hpc $needed" "$work/hint.sh" || {
    echo "FAIL: the hint has no 'llama3-hpc $needed'"
    exit 1
  }
done
mkdir "$work/next"
# mpiexec as the hint names it, from the test's MPI
if ! (cd "$work/next" && PATH="$(dirname "$mpiexec"):$PATH" timeout -k 5 300 bash -e ../hint.sh) \
  >"$work/hint.out" 2>&1; then
  tail -20 "$work/hint.out"
  echo "FAIL: the demo's closing hint, run as written"
  exit 1
fi
for made in ckpt/rm ckpt/dpo ckpt/grpo hf/dpo/config.json completions.jsonl report.html; do
  [[ -e "$work/next/$made" ]] || {
    echo "FAIL: the hint's commands made no $made"
    exit 1
  }
done
echo "ok: the demo's closing hint runs as written ($(grep -c . "$work/hint.sh") lines)"
