#!/usr/bin/env bash
# DPO through the real program under mpiexec, on the reversal task's preference pairs, from a
# small SFT checkpoint:
#   step 1's loss is exactly log 2 and its reward accuracy 0 (the policy is the reference), for
#   full fine-tuning (precomputed reference, stored under --ckpt-dir) and LoRA (the base model);
#   2 ranks give the losses of 1 rank; the loss falls and the accuracy rises;
#   rank 1 killed at step 7 and restarted: the weights (and LoRA's adapters, with dropout) bit
#   for bit those of the uninterrupted run, the stored reference read back, not recomputed;
#   killed on 2 ranks and resumed on 1: the same losses within reduction-order tolerance;
#   ZeRO-3 (and LoRA with its frozen model sharded): the losses of the unsharded runs;
#   eval of the final checkpoint gives the DPO metrics with TRL's names.
#
#   dpo_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-dpo-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/mpi_runs.sh
source "$(dirname "$0")/../support/mpi_runs.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
prep_reversal_data "$bin" "$work" || {
  echo "prep failed"
  exit 1
}

# first_step FILE KEY: KEY's value in step 1's record of metrics FILE.
first_step() { grep '"step":1,' "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }
worst_loss_difference() {
  paste <(grep '"kind":"train"' "$1" | grep -o '"loss":[^,]*' | tail -"$3" | cut -d: -f2) \
    <(grep '"kind":"train"' "$2" | grep -o '"loss":[^,]*' | cut -d: -f2) |
    awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d} END {printf "%g", m}'
}

run 1 sft --model tiny --data "$work/sft" --steps 16 --seq-len 128 --global-batch 8 --lr 3e-3 \
  --ckpt-dir "$work/sft-ckpt" --log-every 0 --no-progress || {
  cat "$work/last.err"
  echo "the SFT run failed"
  exit 1
}
dpo_args=(dpo --init "$work/sft-ckpt" --data "$work/pref" --steps 12 --seq-len 128 --global-batch 8
  --micro-batch 2 --lr 2e-3 --warmup 1 --beta 0.2 --checkpoint-every 4 --log-every 0 --no-progress)
log2=0.6931471805599453

# --- full fine-tuning: the reference precomputed ---
run 2 "${dpo_args[@]}" --ckpt-dir "$work/ref" --metrics "$work/ref.jsonl" --val-data "$work/pref" ||
  fail "the DPO reference run (rc $?): $(tail -2 "$work/last.err")"
if [[ "$(first_step "$work/ref.jsonl" loss)" == "$log2" &&
  "$(first_step "$work/ref.jsonl" 'rewards/accuracies')" == 0.0 ]]; then
  pass "step 1: loss exactly log 2, reward accuracy 0"
else
  fail "step 1: loss exactly log 2, reward accuracy 0 (got $(first_step "$work/ref.jsonl" loss))"
fi
last_loss=$(grep '"kind":"train"' "$work/ref.jsonl" | tail -1 | grep -o '"loss":[^,]*' | cut -d: -f2)
eval_accuracy=$(grep '"kind":"eval"' "$work/ref.jsonl" | tail -1 | grep -o '"rewards/accuracies":[^,]*' | cut -d: -f2)
if awk -v l="$last_loss" -v a="$eval_accuracy" -v z=$log2 'BEGIN {exit !(l < z && a > 0.5)}'; then
  pass "the loss falls (step 12: $last_loss) and the validation reward accuracy rises ($eval_accuracy)"
else
  fail "the loss falls and the accuracy rises (loss $last_loss, accuracy '$eval_accuracy')"
fi
if [[ -f "$work/ref/reference/train.h5" && -f "$work/ref/reference/val.h5" ]] &&
  grep -q '"kind": "precomputed"' "$work/ref/step-00000012/manifest.json"; then
  pass "the reference's log-probabilities stored under --ckpt-dir, recorded in the checkpoint"
else
  fail "the reference's log-probabilities stored under --ckpt-dir, recorded in the checkpoint"
fi
ref=$(digest "$work/ref/step-00000012")

run 1 "${dpo_args[@]}" --ckpt-dir "$work/one" --metrics "$work/one.jsonl"
worst=$(worst_loss_difference "$work/ref.jsonl" "$work/one.jsonl" 12)
if awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}'; then
  pass "1 rank gives the losses of 2 (worst relative difference $worst)"
else
  fail "1 rank gives the losses of 2 (worst relative difference '$worst')"
fi

L3_FAULT="train.update@1#7=kill" run 2 "${dpo_args[@]}" --ckpt-dir "$work/killed" --val-data "$work/pref" --checkpoint-sync
first=$?
run 2 "${dpo_args[@]}" --ckpt-dir "$work/killed" --val-data "$work/pref"
rc=$?
if [[ $first -ne 0 && $rc -eq 0 && -n "$ref" && "$(digest "$work/killed/step-00000012")" == "$ref" ]] &&
  grep -q "DPO reference (train pairs): read from" "$work/last.err"; then
  pass "rank 1 killed at step 7, resumed: the weights bit for bit, the reference read back"
else
  fail "rank 1 killed at step 7, resumed: the weights bit for bit (first rc $first, rc $rc)"
  tail -3 "$work/last.err"
fi

L3_FAULT="train.update@0#7=kill" run 2 "${dpo_args[@]}" --ckpt-dir "$work/reshard" --checkpoint-sync
run 1 "${dpo_args[@]}" --ckpt-dir "$work/reshard" --metrics "$work/reshard.jsonl"
rc=$?
worst=$(worst_loss_difference "$work/ref.jsonl" "$work/reshard.jsonl" 8)
if [[ $rc -eq 0 ]] && grep -q "written by 2 ranks" "$work/last.err" &&
  awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}'; then
  pass "killed on 2 ranks, resumed on 1: the same losses (worst relative difference $worst)"
else
  fail "killed on 2 ranks, resumed on 1 (rc $rc, worst '$worst')"
  tail -3 "$work/last.err"
fi

# --- ZeRO-3: the weights sharded (gathered group by group for every pass, the reference's too) ---
run 2 "${dpo_args[@]}" --ckpt-dir "$work/zero3" --metrics "$work/zero3.jsonl" --shard-gradients \
  --shard-parameters --val-data "$work/pref"
rc=$?
worst=$(worst_loss_difference "$work/ref.jsonl" "$work/zero3.jsonl" 12)
if [[ $rc -eq 0 && "$(first_step "$work/zero3.jsonl" loss)" == "$log2" ]] &&
  awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}'; then
  pass "ZeRO-3: step 1 exactly log 2, the losses of ZeRO-1 (worst relative difference $worst)"
else
  fail "ZeRO-3: step 1 exactly log 2, the losses of ZeRO-1 (rc $rc, worst '$worst')"
  tail -3 "$work/last.err"
fi

# --- LoRA: the base model without its adapters is the reference ---
lora_args=("${dpo_args[@]}" --lora-rank 4 --lora-dropout 0.1)
run 2 "${lora_args[@]}" --ckpt-dir "$work/lora" --metrics "$work/lora.jsonl" ||
  fail "the LoRA DPO run (rc $?): $(tail -2 "$work/last.err")"
if [[ "$(first_step "$work/lora.jsonl" loss)" == "$log2" ]] &&
  grep -q "DPO reference: the base model without the adapters" "$work/last.err" &&
  [[ ! -e "$work/lora/reference" ]]; then
  pass "LoRA: step 1's loss exactly log 2, the base model the reference (nothing stored)"
else
  fail "LoRA: step 1's loss exactly log 2, the base model the reference"
fi
L3_FAULT="train.update@1#7=kill" run 2 "${lora_args[@]}" --ckpt-dir "$work/lora-killed" --checkpoint-sync
first=$?
run 2 "${lora_args[@]}" --ckpt-dir "$work/lora-killed"
rc=$?
lora_ref=$(digest "$work/lora/step-00000012")
if [[ $first -ne 0 && $rc -eq 0 && -n "$lora_ref" &&
  "$(digest "$work/lora-killed/step-00000012")" == "$lora_ref" ]]; then
  pass "LoRA with dropout: rank 1 killed at step 7, resumed: the adapters bit for bit"
else
  fail "LoRA with dropout: killed and resumed bit for bit (first rc $first, rc $rc)"
fi

run 2 "${lora_args[@]}" --ckpt-dir "$work/lora-zero3" --metrics "$work/lora-zero3.jsonl" \
  --shard-gradients --shard-parameters
rc=$?
worst=$(worst_loss_difference "$work/lora.jsonl" "$work/lora-zero3.jsonl" 12)
if [[ $rc -eq 0 ]] && awk -v w="$worst" 'BEGIN {exit !(w < 1e-5)}'; then
  pass "LoRA with the frozen model sharded: the losses of LoRA unsharded (worst $worst)"
else
  fail "LoRA with the frozen model sharded (rc $rc, worst '$worst')"
  tail -3 "$work/last.err"
fi

# --- eval of DPO checkpoints: the reference the manifest records, found without options ---
train_eval=$(grep '"kind":"eval"' "$work/ref.jsonl" | tail -1 | grep -o '"loss":[^,]*' | cut -d: -f2)
run 2 eval --init "$work/ref/step-00000012" --data "$work/pref" --micro-batch 2
rc=$?
eval_loss=$(grep -o '"loss":[^,]*' "$work/last.out" | cut -d: -f2)
if [[ $rc -eq 0 ]] && grep -q '"rewards/accuracies"' "$work/last.out" &&
  awk -v a="$eval_loss" -v b="$train_eval" 'BEGIN {d = (a - b) / b; if (d < 0) d = -d; exit !(d < 1e-5)}'; then
  pass "eval of the DPO checkpoint: the training's validation loss ($eval_loss), TRL's names"
else
  fail "eval of the DPO checkpoint (rc $rc, loss '$eval_loss', training's '$train_eval')"
  tail -3 "$work/last.err"
fi
run 1 eval --init "$work/lora/step-00000012" --data "$work/pref"
rc=$?
eval_accuracy=$(grep -o '"rewards/accuracies":[^,]*' "$work/last.out" | cut -d: -f2)
if [[ $rc -eq 0 ]] && awk -v a="$eval_accuracy" 'BEGIN {exit !(a > 0.5)}'; then
  pass "eval of the LoRA DPO checkpoint against its base (reward accuracy $eval_accuracy)"
else
  fail "eval of the LoRA DPO checkpoint (rc $rc, accuracy '$eval_accuracy')"
  tail -3 "$work/last.err"
fi

# --- export: the result is a causal LM ---
run 1 export --ckpt "$work/ref/step-00000012" --output "$work/hf-dpo"
rc=$?
if [[ $rc -eq 0 ]] && grep -q LlamaForCausalLM "$work/hf-dpo/config.json"; then
  pass "export of the DPO checkpoint: a LlamaForCausalLM"
else
  fail "export of the DPO checkpoint (rc $rc): $(tail -1 "$work/last.err")"
fi

# --- from a Hugging Face model (the SFT model exported): the same start ---
run 1 export --ckpt "$work/sft-ckpt" --output "$work/hf-sft" --dtype fp32 &&
  run 1 dpo --init "$work/hf-sft" --data "$work/pref" --steps 2 --seq-len 128 --global-batch 8 \
    --micro-batch 2 --ckpt-dir "$work/from-hf" --metrics "$work/from-hf.jsonl" --no-progress
rc=$?
if [[ $rc -eq 0 && "$(first_step "$work/from-hf.jsonl" loss)" == "$log2" ]]; then
  pass "from a Hugging Face model: step 1 exactly log 2"
else
  fail "from a Hugging Face model (rc $rc): $(tail -1 "$work/last.err")"
fi

# --- the stored reference is keyed on the data's content: relabelled pairs of the same shape ---
# chosen and rejected of equal length, then swapped: the offsets and lengths are the same, the
# tokens are not. With the reference directory kept, step 1 is log 2 again (the table recomputed,
# not the first data's reused).
for i in $(seq 1 24); do
  w="pair$((i % 13))z$((i % 4))"
  printf '{"prompt":"Reverse %s.","chosen":"%s","rejected":"%s"}\n' "$w" "$(echo "$w" | rev)" "$w"
done >"$work/equal.jsonl"
sed 's/"chosen":\("[^"]*"\),"rejected":\("[^"]*"\)/"chosen":\2,"rejected":\1/' "$work/equal.jsonl" >"$work/swapped.jsonl"
swap_ok=1
for data in equal swapped; do
  "$bin" prep preference --input "$work/$data.jsonl" --tokenizer bytes --output "$work/pairs-$data" \
    >/dev/null 2>&1 || swap_ok=0
  run 1 dpo --init "$work/sft-ckpt" --data "$work/pairs-$data" --steps 1 --seq-len 128 \
    --global-batch 8 --reference-dir "$work/kept-reference" --metrics "$work/$data.jsonl.out" \
    --no-progress || swap_ok=0
  [[ "$(first_step "$work/$data.jsonl.out" loss)" == "$log2" ]] || swap_ok=0
done
if [[ $swap_ok == 1 ]] && grep -q "(computed for other data)" "$work/last.err"; then
  pass "chosen and rejected swapped, same lengths, reference directory kept: step 1 log 2 again"
else
  fail "chosen and rejected swapped: step 1 log 2 again (got $(first_step "$work/swapped.jsonl.out" loss))"
  tail -3 "$work/last.err"
fi

# --- eval of a DPO checkpoint: stored tables first, the reference model only when needed ---
cp -r "$work/sft-ckpt" "$work/init-copy"
run 1 dpo --init "$work/init-copy" --data "$work/pref" --val-data "$work/pairs-equal" --steps 2 \
  --seq-len 128 --global-batch 8 --ckpt-dir "$work/gone" --no-progress || fail "the DPO run to evaluate"
rm -rf "$work/init-copy"  # its reference model is gone
run 1 eval --init "$work/gone" --data "$work/pairs-equal"
rc=$?
if [[ $rc -eq 0 ]] && grep -q "DPO reference (24 pairs): read from $work/gone/reference/val.h5" "$work/last.err" &&
  grep -q '"skipped_samples":0' "$work/last.out"; then
  pass "eval of a DPO checkpoint whose reference model is gone: the validation table it stored"
else
  fail "eval with the stored validation table (rc $rc): $(tail -1 "$work/last.err")"
fi
run 1 eval --init "$work/gone" --data "$work/pairs-swapped"
rc=$?
if [[ $rc -eq 2 ]] && grep -q "the reference model .* cannot be read" "$work/last.err" &&
  grep -q "reference/val.h5) was computed for this data" "$work/last.err"; then
  pass "eval on other data with the reference model gone: exit 2 naming the model and the tables"
else
  fail "eval on other data with the reference model gone (rc $rc): $(tail -1 "$work/last.err")"
fi
run 1 eval --init "$work/gone" --data "$work/sft"
rc=$?
if [[ $rc -eq 0 ]] && grep -q '"perplexity"' "$work/last.out"; then
  pass "eval of a DPO checkpoint on SFT data: loss and perplexity"
else
  fail "eval of a DPO checkpoint on SFT data (rc $rc): $(tail -1 "$work/last.err")"
fi
for attempt in computed read; do
  run 1 eval --init "$work/ref/step-00000012" --data "$work/pairs-swapped" --reference-dir "$work/eval-ref"
  rc=$?
  if [[ $rc -eq 0 && $attempt == computed ]] && grep -q "computed with .*; stored in" "$work/last.err"; then
    pass "eval --reference-dir: the reference computed and stored"
  elif [[ $rc -eq 0 && $attempt == read ]] && grep -q "read from $work/eval-ref/eval-" "$work/last.err"; then
    pass "eval --reference-dir again: read back, not computed"
  else
    fail "eval --reference-dir ($attempt, rc $rc): $(tail -1 "$work/last.err")"
  fi
done
run 2 eval --init "$work/ref/step-00000012" --data "$work/pref" --micro-batch 2 --shard-parameters
rc=$?
sharded_loss=$(grep -o '"loss":[^,]*' "$work/last.out" | cut -d: -f2)
if [[ $rc -eq 0 ]] && awk -v a="$sharded_loss" -v b="$train_eval" 'BEGIN {d = (a - b) / b; if (d < 0) d = -d; exit !(d < 1e-5)}'; then
  pass "eval --shard-parameters of the DPO checkpoint on 2 ranks: the training's loss ($sharded_loss)"
else
  fail "eval --shard-parameters of the DPO checkpoint (rc $rc, loss '$sharded_loss')"
  tail -3 "$work/last.err"
fi

# --- options that cannot work: one-line errors, exit 2 ---
run 1 "${dpo_args[@]}" --ckpt-dir "$work/bad" --loss ipo --label-smoothing 0.1
rc=$?
if [[ $rc -eq 2 ]] && grep -q "label-smoothing applies to --loss sigmoid only" "$work/last.err"; then
  pass "--label-smoothing with --loss ipo: exit 2"
else
  fail "--label-smoothing with --loss ipo: exit 2 (rc $rc)"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all DPO checks passed"
