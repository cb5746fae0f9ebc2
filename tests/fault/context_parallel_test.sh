#!/usr/bin/env bash
# Context parallelism (--context-parallel C) through the real program under mpiexec, on the
# reversal task (many short documents per row of 128 tokens: segments cross the chunks):
#   CP 2 and 4, CP 2 x data parallel 2 with ZeRO-3 (and hybrid shard groups of 2), CP 2 with
#   --recompute: the 1-rank run's
#   losses, gradient norms and evaluation loss within 1e-5 over 5 steps;
#   a sequence longer than one rank's memory budget (L3_MEMORY_PER_RANK_MIB) refused on 1 rank
#   and trained under CP 4;
#   killed (SIGKILL) after a checkpoint and resumed on the same layout: bit for bit; resumed on
#   another layout (1 rank, CP 4): the same losses within reduction-order tolerance;
#   DPO (full fine-tuning and LoRA) and reward models under CP 2 and 4: the 1-rank run's losses,
#   gradient norms and evaluation within 1e-5, DPO's step 1 exactly log 2;
#   `eval --context-parallel 2` on 4 ranks of the SFT, reward and DPO checkpoints: the 1-rank
#   figures within 1e-5;
#   what it refuses: --seq-len not a multiple of 2C, ranks not a multiple of C, grpo, eval on
#   prompt data.
#
#   context_parallel_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
export OMP_NUM_THREADS=1

# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/mpi_runs.sh
source "$(dirname "$0")/../support/mpi_runs.sh"
# shellcheck source=tests/support/metrics_diff.sh
source "$(dirname "$0")/../support/metrics_diff.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-context

common=(sft --model tiny --data "$work/sft" --val-data "$work/sft" --seq-len 128 --global-batch 4
  --micro-batch 2 --lr 3e-3 --warmup 2 --steps 5 --eval-every 5 --log-every 0 --no-progress)

# --- the same training on 1 rank and split over 2 and 4 ---
run 1 "${common[@]}" --metrics "$work/cp1.jsonl" --ckpt-dir "$work/sft-ckpt" || {
  cat "$work/last.err"
  echo "the 1-rank reference failed"
  exit 1
}
for layout in "2:--context-parallel 2" "4:--context-parallel 4" \
  "4:--context-parallel 2 --shard-parameters" \
  "4:--context-parallel 2 --shard-parameters --shard-group-size 2" \
  "2:--context-parallel 2 --recompute"; do
  ranks=${layout%%:*}
  read -r -a extra <<<"${layout#*:}"
  name="$ranks ranks, ${layout#*:}"
  metrics="$work/cp-${ranks}-${extra[*]// /}.jsonl"
  metrics=${metrics//--/}
  if run "$ranks" "${common[@]}" "${extra[@]}" --metrics "$metrics"; then
    worst=$(differences "$work/cp1.jsonl" "$metrics")
    check "$name: the 1-rank run's losses, gradient norms and evaluation within 1e-5 ($worst)" \
      within "$worst" 1e-5
  else
    fail "$name ran"
    tail -3 "$work/last.err"
  fi
done
if grep -q "context parallel 2" "$work/last.out" "$work/last.err"; then
  pass "the log names the process grid"
else
  fail "the log names the process grid"
fi

# --- DPO: sequences' log-probabilities over the group's rows ---
dpo=(dpo --init "$work/sft-ckpt" --data "$work/pref" --val-data "$work/pref" --seq-len 128
  --global-batch 4 --micro-batch 2 --lr 1e-3 --steps 5 --eval-every 5 --log-every 0 --no-progress)
for variant in "full:" "LoRA:--lora-rank 4"; do
  read -r -a extra <<<"${variant#*:}"
  name=${variant%%:*}
  if ! run 1 "${dpo[@]}" "${extra[@]}" --metrics "$work/dpo-$name-1.jsonl" \
    --ckpt-dir "$work/dpo-$name-ckpt"; then
    fail "DPO ($name) on 1 rank ran"
    tail -3 "$work/last.err"
    continue
  fi
  for ranks in 2 4; do
    if run "$ranks" "${dpo[@]}" "${extra[@]}" --context-parallel "$ranks" \
      --metrics "$work/dpo-$name-$ranks.jsonl"; then
      worst=$(differences "$work/dpo-$name-1.jsonl" "$work/dpo-$name-$ranks.jsonl")
      check "DPO ($name), CP $ranks: the 1-rank run's losses, gradient norms and evaluation within 1e-5 ($worst)" \
        within "$worst" 1e-5
    else
      fail "DPO ($name), CP $ranks ran"
      tail -3 "$work/last.err"
    fi
  done
done
# --- reward: each sequence's score read on the rank holding its last token ---
reward=(reward --init "$work/sft-ckpt" --data "$work/pref" --val-data "$work/pref" --seq-len 128
  --global-batch 4 --micro-batch 2 --lr 1e-3 --steps 5 --eval-every 5 --log-every 0 --no-progress)
if run 1 "${reward[@]}" --metrics "$work/rm-1.jsonl" --ckpt-dir "$work/rm-ckpt"; then
  for ranks in 2 4; do
    if run "$ranks" "${reward[@]}" --context-parallel "$ranks" --metrics "$work/rm-$ranks.jsonl"; then
      worst=$(differences "$work/rm-1.jsonl" "$work/rm-$ranks.jsonl")
      check "reward, CP $ranks: the 1-rank run's losses, gradient norms and evaluation within 1e-5 ($worst)" \
        within "$worst" 1e-5
    else
      fail "reward, CP $ranks ran"
      tail -3 "$work/last.err"
    fi
  done
else
  fail "reward on 1 rank ran"
  tail -3 "$work/last.err"
fi
# --- eval --context-parallel: the 1-rank evaluation's figures ---
same_json() { # A.json B.json: every number within 1e-5 (relative), the same keys
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
ok = a.keys() == b.keys() and all(
    a[k] == b[k] or abs(a[k] - b[k]) <= 1e-5 * max(abs(a[k]), abs(b[k])) for k in a)
sys.exit(0 if ok else 1)
PY
}
for pair in "sft-ckpt:sft" "rm-ckpt:pref" "dpo-full-ckpt:pref"; do
  ckpt=${pair%%:*}
  data=${pair#*:}
  if run 1 eval --init "$work/$ckpt" --data "$work/$data" --seq-len 128 &&
    cp "$work/last.out" "$work/eval-1.json" &&
    run 4 eval --init "$work/$ckpt" --data "$work/$data" --seq-len 128 --context-parallel 2 &&
    same_json "$work/eval-1.json" "$work/last.out"; then
    pass "eval of $ckpt on $data, CP 2 x 2 groups: the 1-rank figures within 1e-5"
  else
    fail "eval of $ckpt on $data, CP 2 x 2 groups: the 1-rank figures within 1e-5"
    cat "$work/eval-1.json" "$work/last.out"
    tail -2 "$work/last.err"
  fi
done
if grep -q '"loss":0.6931471805599453' "$work/dpo-full-2.jsonl"; then
  pass "DPO under CP 2: step 1's loss exactly log 2"
else
  fail "DPO under CP 2: step 1's loss exactly log 2"
fi

# --- a sequence longer than one rank's budget ---
python3 - "$work/long.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(4):
        body = "".join("abcdefghij klmnop"[(i * 7 + j * 3) % 17] for j in range(2100))
        f.write(json.dumps({"prompt": f"Summarise {i}.", "completion": body}) + "\n")
PY
"$bin" prep sft --input "$work/long.jsonl" --tokenizer bytes --output "$work/long" >/dev/null 2>&1
long=(sft --model tiny --data "$work/long" --seq-len 2048 --global-batch 1 --steps 2 --no-progress)
L3_MEMORY_PER_RANK_MIB=20 run 1 "${long[@]}"
rc=$?
if [[ $rc -eq 2 ]] && grep -q "more than the .* it has here (L3_MEMORY_PER_RANK_MIB)" "$work/last.err" &&
  grep -q -- "--context-parallel" "$work/last.err"; then
  pass "2048 tokens on one rank with 20 MiB: refused (exit 2), --context-parallel suggested"
else
  fail "2048 tokens on one rank with 20 MiB: refused (exit $rc)"
  tail -2 "$work/last.err"
fi
if L3_MEMORY_PER_RANK_MIB=20 run 4 "${long[@]}" --context-parallel 4; then
  pass "the same sequence trains over 4 ranks of 20 MiB each (--context-parallel 4)"
else
  fail "the same sequence trains over 4 ranks of 20 MiB each (--context-parallel 4)"
  tail -2 "$work/last.err"
fi

# --- kill and resume ---
restart=(sft --model tiny --data "$work/sft" --seq-len 128 --global-batch 4 --micro-batch 2 --lr 3e-3
  --warmup 2 --steps 12 --checkpoint-every 4 --log-every 0 --no-progress)
run 2 "${restart[@]}" --context-parallel 2 --ckpt-dir "$work/ref" --metrics "$work/ref.jsonl" || {
  cat "$work/last.err"
  echo "the uninterrupted CP 2 run failed"
  exit 1
}
L3_FAULT="train.update@1#7=kill" run 2 "${restart[@]}" --context-parallel 2 --ckpt-dir "$work/killed"
rc=$?
run 2 "${restart[@]}" --context-parallel 2 --ckpt-dir "$work/killed"
if [[ $rc -ne 0 && -n "$(digest "$work/ref/step-00000012")" ]] &&
  [[ "$(digest "$work/killed/step-00000012")" == "$(digest "$work/ref/step-00000012")" ]]; then
  pass "CP 2 killed in step 7 and resumed: bit for bit"
else
  fail "CP 2 killed in step 7 and resumed: bit for bit (first exit $rc)"
  tail -2 "$work/last.err"
fi
# Resumed from step 4 on other layouts: steps 5-12 against the uninterrupted run.
for layout in "1:--context-parallel 1" "4:--context-parallel 4"; do
  ranks=${layout%%:*}
  read -r -a extra <<<"${layout#*:}"
  dir="$work/moved-$ranks"
  mkdir -p "$dir" && cp -r "$work/ref/step-00000004" "$dir/" && echo step-00000004 >"$dir/latest"
  if run "$ranks" "${restart[@]}" "${extra[@]}" --ckpt-dir "$dir" --resume auto \
    --metrics "$dir/metrics.jsonl"; then
    worst=$(paste <(grep -o '"loss":[^,]*' "$work/ref.jsonl" | tail -8 | cut -d: -f2) \
      <(grep -o '"loss":[^,]*' "$dir/metrics.jsonl" | cut -d: -f2) |
      awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d; n++} END {if (n != 8) m = 1; printf "%g", m}')
    check "CP 2's step 4 resumed on $ranks rank(s), ${layout#*:}: losses within 1e-5 ($worst)" \
      within "$worst" 1e-5
  else
    fail "CP 2's step 4 resumed on $ranks rank(s), ${layout#*:}"
    tail -3 "$work/last.err"
  fi
done

# --- what it refuses ---
refused "--seq-len 102 with --context-parallel 2: not a multiple of 4" 2 "must be a multiple of 4" \
  sft --model tiny --data "$work/sft" --seq-len 102 --global-batch 2 --steps 1 --context-parallel 2
refused "3 ranks in groups of 2" 3 "must split into groups of 2" \
  sft --model tiny --data "$work/sft" --seq-len 128 --global-batch 3 --steps 1 --context-parallel 2
write_reversal_prompts "$work/sft.jsonl" "$work/prompts.jsonl"
"$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
  >/dev/null 2>&1
refused "eval of prompt data with --context-parallel" 2 "not on prompt data" \
  eval --init "$work/sft-ckpt" --data "$work/prompts" --seq-len 128 --context-parallel 2
refused "grpo with --context-parallel" 2 "not with grpo so far" \
  grpo --init "$work/sft-ckpt" --data "$work/prompts" --seq-len 128 --max-completion-length 32 \
  --global-batch 2 --steps 1 --reward-match answer --context-parallel 2

finish_checks "context-parallel checks"
