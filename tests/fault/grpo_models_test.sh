#!/usr/bin/env bash
# GRPO with models beside the policy, through the real program under mpiexec, on the reversal
# task from a small SFT checkpoint:
#   --reward-model: a reward checkpoint scores each completion as `score --prompt --response`
#   does (its --json reward); on 2 ranks with --shard-parameters (the reward model sharded too)
#   the rewards of 1 rank; a base with --reward-adapter scores as `score --adapter` does; a
#   language model given as the reward model, or --reward-adapter alone, is exit 2 naming it;
#   --beta with full fine-tuning: a frozen copy of the initial model is the reference: step 1's
#   KL is exactly 0 and later ones are not; sharded with --shard-parameters it gives the same
#   losses and KL; the checkpoints name it; killed and resumed, the run reloads it, checks its
#   digest and ends with the uninterrupted run's weights, bit for bit; --dry-run-memory plans
#   both models.
#
#   grpo_models_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
export OMP_NUM_THREADS=1

# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/mpi_runs.sh
source "$(dirname "$0")/../support/mpi_runs.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-grpo-models

write_reversal_prompts "$work/sft.jsonl" "$work/prompts.jsonl"
"$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
  >/dev/null 2>&1 || {
  echo "prep prompts failed"
  exit 1
}
setup() {
  run 1 sft --model tiny --data "$work/sft" --steps 16 --seq-len 64 --global-batch 8 --lr 3e-3 \
    --ckpt-dir "$work/sft-ckpt" --log-every 0 --no-progress &&
    run 1 reward --init "$work/sft-ckpt" --data "$work/pref" --steps 8 --seq-len 128 \
      --global-batch 8 --lr 1e-3 --ckpt-dir "$work/rm" --log-every 0 --no-progress &&
    run 1 reward --init "$work/sft-ckpt" --data "$work/pref" --steps 8 --seq-len 128 \
      --global-batch 8 --lr 1e-3 --lora-rank 4 --ckpt-dir "$work/rm-lora" --log-every 0 \
      --no-progress &&
    "$bin" export --init "$work/rm-lora" --adapter --output "$work/rm-adapter" >/dev/null 2>&1
}
setup || {
  cat "$work/last.err"
  echo "the SFT and reward runs failed"
  exit 1
}

# One pass per step (16 completions): with several, ZeRO-2/3 add a step's micro-batches up in
# another order than ZeRO-1 (the embedding's gradient then differs in its last bits), and the
# sharded runs below are compared with the unsharded ones bit for bit.
base_args=(grpo --init "$work/sft-ckpt" --data "$work/prompts" --seq-len 64
  --global-batch 4 --num-generations 4 --micro-batch 16 --max-completion-length 16
  --temperature 1.0 --lr 1e-3 --log-every 0 --no-progress --deterministic)

# --- a reward checkpoint: each completion's reward is `score`'s ---
run 1 "${base_args[@]}" --reward-model "$work/rm" --steps 2 --ckpt-dir "$work/by-rm" \
  --metrics "$work/by-rm.jsonl" --log-completions "$work/by-rm-samples.jsonl" ||
  fail "grpo --reward-model (rc $?): $(tail -3 "$work/last.err")"
# check_scores SAMPLES SCORE_ARGS...: every fourth sample of step 1 scored by `score --json`.
check_scores() {
  python3 - "$bin" "$@" <<'PY'
import json, subprocess, sys
bin, samples, args = sys.argv[1], sys.argv[2], sys.argv[3:]
step1 = [json.loads(l) for l in open(samples) if '"step":1,' in l][::4]
assert len(step1) == 4, len(step1)
for s in step1:
    out = subprocess.run([bin, "score", *args, "--prompt", s["record"]["prompt"], "--response",
                          s["completion"], "--json"], capture_output=True, text=True, check=True)
    theirs, ours = json.loads(out.stdout)["reward"], s["rewards/reward_model"]
    assert abs(ours - theirs) <= 1e-6 * max(1.0, abs(theirs)), (ours, theirs, s["completion"])
PY
}
if check_scores "$work/by-rm-samples.jsonl" --init "$work/rm" &&
  grep -q '"rewards/reward_model/mean"' "$work/by-rm.jsonl"; then
  pass "--reward-model CKPT: each completion's reward is score --prompt --response's"
else
  fail "--reward-model's rewards are not score's"
fi

# --- 2 ranks, the reward model sharded like the policy: 1 rank's rewards ---
run 2 "${base_args[@]}" --reward-model "$work/rm" --steps 2 --shard-parameters \
  --ckpt-dir "$work/by-rm-2" --log-completions "$work/by-rm-2-samples.jsonl" ||
  fail "grpo --reward-model on 2 ranks, sharded (rc $?): $(tail -3 "$work/last.err")"
if python3 - "$work/by-rm-samples.jsonl" "$work/by-rm-2-samples.jsonl" <<'PY'; then
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
two = [json.loads(l) for l in open(sys.argv[2])]
assert len(one) == len(two) == 32
for a, b in zip(one, two):
    assert a["completion"] == b["completion"]
    x, y = a["rewards/reward_model"], b["rewards/reward_model"]
    assert abs(x - y) <= 1e-6 * max(1.0, abs(x)), (x, y)
PY
  pass "2 ranks, --shard-parameters: the reward model gives 1 rank's rewards (2 steps)"
else
  fail "the sharded reward model's rewards on 2 ranks"
fi

# --- a base model with a reward adapter: score --adapter's rewards ---
run 1 "${base_args[@]}" --reward-model "$work/sft-ckpt" --reward-adapter "$work/rm-adapter" \
  --steps 1 --ckpt-dir "$work/by-adapter" --log-completions "$work/by-adapter-samples.jsonl" ||
  fail "grpo --reward-adapter (rc $?): $(tail -3 "$work/last.err")"
if check_scores "$work/by-adapter-samples.jsonl" --init "$work/sft-ckpt" --adapter "$work/rm-adapter"; then
  pass "--reward-model BASE --reward-adapter DIR: score --adapter's rewards"
else
  fail "--reward-adapter's rewards are not score --adapter's"
fi

# --- the reward model exported to Hugging Face (LlamaForSequenceClassification): the same rewards ---
if "$bin" export --init "$work/rm" --dtype fp32 --output "$work/rm-hf" >/dev/null 2>&1 &&
  run 1 "${base_args[@]}" --reward-model "$work/rm-hf" --steps 2 --ckpt-dir "$work/by-hf" \
    --log-completions "$work/by-hf-samples.jsonl" &&
  python3 - "$work/by-rm-samples.jsonl" "$work/by-hf-samples.jsonl" <<'PY'; then
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
hf = [json.loads(l) for l in open(sys.argv[2])]
assert len(one) == len(hf) == 32
for a, b in zip(one, hf):
    assert a["completion"] == b["completion"] and a["rewards/reward_model"] == b["rewards/reward_model"]
PY
  pass "--reward-model HF_DIR (its export as LlamaForSequenceClassification): the checkpoint's rewards"
else
  fail "--reward-model with the Hugging Face export: $(tail -2 "$work/last.err")"
fi

# --- models that cannot be reward models ---
run 1 "${base_args[@]}" --reward-model "$work/sft-ckpt" --steps 1 --ckpt-dir "$work/lm-rm"
rc=$?
if [[ $rc -eq 2 ]] && grep -q "sft-ckpt.*not a reward model" "$work/last.err"; then
  pass "a language model as --reward-model: exit 2 naming it"
else
  fail "a language model as --reward-model: rc $rc, $(tail -1 "$work/last.err")"
fi
run 1 "${base_args[@]}" --reward-match answer --reward-adapter "$work/rm-adapter" --steps 1
rc=$?
if [[ $rc -eq 2 ]] && grep -q -- "--reward-adapter DIR needs --reward-model" "$work/last.err"; then
  pass "--reward-adapter without --reward-model: exit 2"
else
  fail "--reward-adapter alone: rc $rc, $(tail -1 "$work/last.err")"
fi

# --- --beta with full fine-tuning: a frozen copy of the initial model ---
beta_args=("${base_args[@]}" --reward-match answer --reward-model "$work/rm" --beta 0.04
  --steps 4 --checkpoint-every 2)
run 2 "${beta_args[@]}" --ckpt-dir "$work/beta" --metrics "$work/beta.jsonl" \
  --log-completions "$work/beta-samples.jsonl" ||
  fail "grpo --beta with full fine-tuning (rc $?): $(tail -3 "$work/last.err")"
if grep '"step":1,' "$work/beta.jsonl" | grep -q '"kl":0.0,' &&
  grep '"step":3,' "$work/beta.jsonl" | grep -q '"kl":0\.0*[1-9]' &&
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["reference"]; sys.exit(not (r["kind"] == "initial model" and r["model"].endswith("sft-ckpt/step-00000016")))' \
    "$work/beta/step-00000004/manifest.json"; then
  pass "--beta, full fine-tuning: step 1's KL to the frozen initial model is 0, later not; the checkpoint names it"
else
  fail "--beta with full fine-tuning: $(grep -o '"kl":[^,]*' "$work/beta.jsonl" | tr '\n' ' ')"
fi
run 2 "${beta_args[@]}" --shard-parameters --ckpt-dir "$work/beta-zero3" --metrics "$work/beta-zero3.jsonl" ||
  fail "grpo --beta with --shard-parameters (rc $?): $(tail -3 "$work/last.err")"
if [[ $(grep -c '"kl":' "$work/beta-zero3.jsonl" 2>/dev/null) -eq 4 ]] &&
  cmp -s <(grep -o '"\(loss\|kl\)":[^,]*' "$work/beta.jsonl") \
    <(grep -o '"\(loss\|kl\)":[^,]*' "$work/beta-zero3.jsonl"); then
  pass "--beta with --shard-parameters (the reference sharded too): the same losses and KL"
else
  fail "--beta with --shard-parameters: other losses or KL: $(diff <(grep -o '"\(loss\|kl\)":[^,]*' "$work/beta.jsonl") <(grep -o '"\(loss\|kl\)":[^,]*' "$work/beta-zero3.jsonl") | tr '\n' ' ')"
fi
L3_FAULT="train.update@1#3=kill" run 2 "${beta_args[@]}" --ckpt-dir "$work/beta-kill"
run 2 "${beta_args[@]}" --ckpt-dir "$work/beta-kill" ||
  fail "resume with --beta (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(digest "$work/beta/step-00000004")" &&
  "$(digest "$work/beta-kill/step-00000004")" == "$(digest "$work/beta/step-00000004")" ]]; then
  pass "--beta, killed at step 3 and resumed: the reference reloaded, the uninterrupted run's weights"
else
  fail "--beta resumed: not the uninterrupted run's weights"
fi

# --- resharded: step 2's checkpoint of 2 ranks resumed on 1 generates the 2-rank run's step 3 ---
run 1 "${beta_args[@]}" --resume "$work/beta/step-00000002" --ckpt-dir "$work/beta-one" \
  --log-completions "$work/beta-one-samples.jsonl" ||
  fail "--beta resumed on 1 rank (rc $?): $(tail -3 "$work/last.err")"
# The completions (text, ids, records, order) byte for byte; the reward model's scores, and the
# advantages made from them, within 1e-5: the reward model scores 16 sequences in one pass on 1
# rank and 8 per rank on 2, and SGEMM's blocking over a pass's rows may change the last bits
# (OpenBLAS's Haswell kernels do: 0.12670204 against 0.12670201).
same_step3=$(python3 - "$work/beta-samples.jsonl" "$work/beta-one-samples.jsonl" <<'PY'
import json, sys
two, one = ([json.loads(l) for l in open(f) if '"step":3,' in l] for f in sys.argv[1:])
scored = lambda k: k in ("reward", "advantage") or k.startswith("rewards/")
problems = [] if len(two) == len(one) == 16 else [f"{len(two)} and {len(one)} samples"]
for a, b in zip(two, one):
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x != y and not (scored(k) and isinstance(x, float) and isinstance(y, float)
                           and abs(x - y) <= 1e-5 * max(1.0, abs(x))):
            problems.append(f"prompt {a.get('prompt_index')} sample {a.get('sample')}: {k}")
print("; ".join(problems[:3]))
PY
)
if [[ -f "$work/beta-one-samples.jsonl" && -z "$same_step3" ]]; then
  pass "--beta, 2 ranks' step 2 resumed on 1 rank: step 3's completions byte for byte, rewards within 1e-5"
else
  fail "--beta resumed on 1 rank: step 3's completions differ from the 2-rank run's: ${same_step3:-no log}"
fi

# --- the memory plan counts both models ---
"$bin" grpo --init "$work/sft-ckpt" --data "$work/prompts" --seq-len 64 --global-batch 4 \
  --micro-batch 4 --max-completion-length 16 --reward-model "$work/rm" --beta 0.04 --dry-run-memory >"$work/plan.out" 2>&1
rc=$?
if [[ $rc -eq 0 ]] && grep -q "GRPO reference: weights" "$work/plan.out" &&
  grep -q "reward model: weights" "$work/plan.out" && grep -q "reward model: a micro-batch" "$work/plan.out"; then
  pass "--dry-run-memory plans the reference copy and the reward model"
else
  fail "--dry-run-memory (rc $rc): $(cat "$work/plan.out")"
fi

finish_checks "GRPO model checks"
