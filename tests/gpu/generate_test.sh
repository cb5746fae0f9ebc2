#!/usr/bin/env bash
# `generate --input` on the CUDA backend through the real program; exits 77 (skipped) without a
# CUDA device. A tiny checkpoint (2 SFT steps on the CPU) completes 5 records x 2 samples on
# the device (bf16 weights and KV cache, device decode attention and sampling) and on the CPU:
# the device's tokens follow the CPU's and its log-probabilities agree within bf16 tolerance;
# --dry-run-memory plans the device's memory.
#   generate_test.sh PATH/TO/llama3-hpc
set -uo pipefail
bin=${1:?usage: generate_test.sh LLAMA3_HPC}
if "$bin" --version | grep -q "^backend cuda: .*devices: none"; then
  echo "SKIP: no CUDA device ($("$bin" --version | grep '^backend cuda:'))"
  exit 77
fi
if ! "$bin" --version | grep -q "^backend cuda:"; then
  echo "SKIP: this build has no CUDA backend"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

for i in $(seq 1 16); do
  printf '{"prompt":"Reverse word%d.","completion":"%d drow"}\n' "$i" "$i"
done >"$work/train.jsonl"
"$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train" >/dev/null ||
  fail "prep"
"$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 --steps 2 --lr 1e-3 \
  --ckpt-dir "$work/ck" --no-progress --backend cpu >"$work/sft.log" 2>&1 || fail "sft: $(tail -3 "$work/sft.log")"
for i in 1 2 3 4 5; do printf '{"prompt":"Reverse word%d.","id":%d}\n' "$i" "$i"; done >"$work/p.jsonl"

for backend in cpu cuda; do
  "$bin" generate --init "$work/ck" --input "$work/p.jsonl" --output "$work/$backend.jsonl" \
    --num-samples 2 --max-new 12 --temperature 0.7 --seed 4 --logprobs --batch-size 3 \
    --backend "$backend" >"$work/$backend.log" 2>&1 || fail "generate on $backend: $(tail -3 "$work/$backend.log")"
done
python3 - "$work/cpu.jsonl" "$work/cuda.jsonl" <<'PY' || fail "the device's completions"
import json, sys
cpu = [json.loads(line) for line in open(sys.argv[1])]
gpu = [json.loads(line) for line in open(sys.argv[2])]
assert len(cpu) == len(gpu) == 10, (len(cpu), len(gpu))
same, worst = 0, 0.0
for c, g in zip(cpu, gpu):
    assert (c["line"], c["sample"], c["id"]) == (g["line"], g["sample"], g["id"])
    assert len(g["logprobs"]) == len(g["ids"]) and all(p <= 0 for p in g["logprobs"])
    same += c["ids"] == g["ids"]
    for a, b, pa, pb in zip(c["ids"], g["ids"], c["logprobs"], g["logprobs"]):
        if a != b:  # the sequences part: nothing after it is comparable
            break
        worst = max(worst, abs(pa - pb) / max(1.0, abs(pa)))
print(f"{same} of {len(cpu)} completions identical on the device; largest log-probability "
      f"difference on the common prefixes {worst:.2e}")
assert same >= 8, same          # bf16 may part a sampled sequence at a near-tie, rarely
assert worst < 0.05, worst
PY
"$bin" generate --init "$work/ck" --input "$work/p.jsonl" --dry-run-memory --backend cuda \
  >"$work/plan.log" 2>&1 || fail "dry run: $(tail -3 "$work/plan.log")"
grep -q "cuda bf16" "$work/plan.log" || fail "the plan is not the device's: $(head -1 "$work/plan.log")"
grep -q "KV cache" "$work/plan.log" || fail "the plan has no KV cache"
echo "PASS"
