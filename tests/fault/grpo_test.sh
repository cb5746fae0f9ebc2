#!/usr/bin/env bash
# GRPO through the real program under mpiexec, on the reversal task's prompts with their exact
# answers, from a small SFT checkpoint:
#   prep prompts: the records kept whole, errors named;
#   2 ranks generate step 1's completions of 1 rank (the same bytes in --log-completions) and
#   follow its losses; the log lets an outsider recompute every advantage and the step's loss;
#   the padded layout (--pad-completions) gives the packed one's completions and losses;
#   ZeRO-3 generates and trains as the unsharded run;
#   with LoRA and --beta > 0 step 1's KL is exactly 0 (the policy is its base) and, the ratio
#   being 1, nothing is clipped;
#   a run killed while generating, while scoring and while updating, and resumed, ends with the
#   uninterrupted run's weights, bit for bit, and its completions' log;
#   --num-iterations 2 trains each generation batch twice (the first update at a ratio of 1), and
#   a run killed inside a cycle resumes on the batch saved under CKPT_DIR/rollouts, bit for bit;
#   a verifier that dies, hangs or answers garbage stops the run with exit 2 and one line naming
#   the command and the prompt; the checkpoint written before is kept.
#
#   grpo_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-grpo-XXXXXX")
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

# --- the prompts: the SFT records' prompts with their answers, and a field carried along ---
write_reversal_prompts "$work/sft.jsonl" "$work/prompts.jsonl"
if "$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
  --val-fraction 0.2 >"$work/last.out" 2>&1 &&
  grep -q '"format": "llama3-hpc/prompts"' "$work/prompts/train/index.json"; then
  pass "prep prompts: train and val splits"
else
  fail "prep prompts: $(cat "$work/last.out")"
fi
echo '{"answer": "x"}' >"$work/bad.jsonl"
"$bin" prep prompts --input "$work/bad.jsonl" --tokenizer bytes --output "$work/bad" >"$work/last.out" 2>&1
rc=$?
if [[ $rc -eq 2 && ! -e "$work/bad" ]] && grep -q 'bad.jsonl:1' "$work/last.out" &&
  grep -q '"prompt"' "$work/last.out"; then
  pass "prep prompts: a record without a prompt is exit 2 naming file:line, nothing written"
else
  fail "prep prompts of a bad record (rc $rc): $(cat "$work/last.out")"
fi

run 1 sft --model tiny --data "$work/sft" --steps 16 --seq-len 64 --global-batch 8 --lr 3e-3 \
  --ckpt-dir "$work/sft-ckpt" --log-every 0 --no-progress || {
  cat "$work/last.err"
  echo "the SFT run failed"
  exit 1
}
# A verifier with a graded reward (the share of the answer's characters the completion has in
# place), so that groups differ and the steps train.
cat >"$work/similarity.py" <<'PY'
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    answer, completion = r["record"]["answer"], r["completion"].strip()
    same = sum(1 for a, b in zip(answer, completion) if a == b)
    print(json.dumps({"reward": same / max(len(answer), len(completion), 1)}), flush=True)
PY
base_args=(grpo --init "$work/sft-ckpt" --data "$work/prompts/train" --reward-match answer
  --seq-len 64 --global-batch 4 --num-generations 4 --micro-batch 4
  --max-completion-length 16 --temperature 1.0 --lr 1e-3 --log-every 0 --no-progress
  --deterministic)
similarity=(--reward-command "python3 $work/similarity.py")
grpo_args=("${base_args[@]}" "${similarity[@]}" --steps 6 --checkpoint-every 2)

# --- 1 rank, 2 ranks (and the 1-rank run's evaluation at its last step, which trains nothing) ---
run 1 "${grpo_args[@]}" --ckpt-dir "$work/one" --metrics "$work/one.jsonl" \
  --log-completions "$work/one-samples.jsonl" --val-data "$work/prompts/val" --eval-every 6 ||
  fail "grpo on 1 rank (rc $?): $(tail -3 "$work/last.err")"
run 2 "${grpo_args[@]}" --ckpt-dir "$work/two" --metrics "$work/two.jsonl" \
  --log-completions "$work/two-samples.jsonl" || fail "grpo on 2 ranks (rc $?): $(tail -3 "$work/last.err")"
if cmp -s <(grep '"step":1,' "$work/one-samples.jsonl") <(grep '"step":1,' "$work/two-samples.jsonl") &&
  [[ $(grep -c '"step":1,' "$work/one-samples.jsonl") -eq 16 ]]; then
  pass "step 1: 2 ranks generate, score and log the 16 completions of 1 rank, byte for byte"
else
  fail "step 1's completions on 1 and 2 ranks"
fi
if python3 - "$work/one.jsonl" "$work/two.jsonl" "$work/one-samples.jsonl" <<'PY'; then
import json, math, sys
from collections import defaultdict
one = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
two = [json.loads(l) for l in open(sys.argv[2]) if '"kind":"train"' in l]
assert len(one) == len(two) == 6, (len(one), len(two))
for a, b in zip(one, two):
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(1.0, abs(a["loss"])), (a["loss"], b["loss"])
    for key in ("reward", "reward_std", "frac_reward_zero_std", "entropy",
                "clip_ratio/region_mean", "completions/mean_length", "completions/clipped_ratio",
                "rewards/answer_match/mean", "rewards/command/mean", "logp_mismatch",
                "time/generate_share"):
        assert key in a, key
    assert a["grad_norm"] > 0  # the graded reward gives the groups different rewards
    assert a["clip_ratio/region_mean"] == 0.0  # one update per generation batch: ratio 1
    assert a["logp_mismatch"] < 1e-5, a["logp_mismatch"]
samples = [json.loads(l) for l in open(sys.argv[3])]
groups = defaultdict(list)
for s in samples:
    groups[(s["step"], s["prompt_index"])].append(s)
for (step, _), g in groups.items():
    assert len(g) == 4
    r = [s["reward"] for s in g]
    mean = sum(r) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 3)
    for s in g:
        assert s["rewards/answer_match"] == (1.0 if s["completion"].strip() == s["record"]["answer"] else 0.0)
        assert s["reward"] == s["rewards/answer_match"] + s["rewards/command"]
        assert abs(s["advantage"] - (s["reward"] - mean) / (std + 1e-4)) < 1e-9, s
# dapo with the ratio 1: the loss is -sum(A_i |y_i|) / sum |y_i| over the step's completions
for m in one:
    steps = [s for s in samples if s["step"] == m["step"]]
    tokens = sum(len(s["ids"]) for s in steps)
    loss = -sum(s["advantage"] * len(s["ids"]) for s in steps) / tokens
    assert abs(loss - m["loss"]) <= 1e-5 * max(1.0, abs(loss)), (m["step"], loss, m["loss"])
PY
  pass "2 ranks follow 1 rank; the log gives every advantage and the loss; the metrics are TRL's"
else
  fail "2 ranks against 1, the log's advantages and loss, the metrics"
fi

# --- the padded layout (--pad-completions): the packed run's completions and losses ---
run 1 "${base_args[@]}" "${similarity[@]}" --steps 2 --pad-completions --ckpt-dir "$work/padded" \
  --metrics "$work/padded.jsonl" --log-completions "$work/padded-samples.jsonl" ||
  fail "grpo --pad-completions (rc $?): $(tail -3 "$work/last.err")"
if cmp -s <(grep -E '"step":[12],' "$work/one-samples.jsonl") "$work/padded-samples.jsonl" &&
  python3 - "$work/one.jsonl" "$work/padded.jsonl" <<'PY'; then
import json, sys
packed = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l][:2]
padded = [json.loads(l) for l in open(sys.argv[2]) if '"kind":"train"' in l]
assert len(padded) == 2, len(padded)
for a, b in zip(packed, padded):
    for key in ("loss", "grad_norm", "entropy"):
        assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a[key], b[key])
    # rows of --seq-len 64 against the completions end to end (rounded up to 16 per pass)
    assert a["train_tokens"] < b["train_tokens"] == 16 * 64, (a["train_tokens"], b["train_tokens"])
    assert a["train_padding_share"] < 0.1 < b["train_padding_share"], a
    print(f"step {a['step']}: loss {a['loss']:.8g} packed, {b['loss']:.8g} padded; "
          f"{a['train_tokens']:.0f} tokens against {b['train_tokens']:.0f}")
PY
  pass "packed completions: the padded layout's completions and losses (fp32), fewer tokens"
else
  fail "packed against padded completions"
fi

# --- eval of the GRPO checkpoint on prompt data: grpo's own greedy evaluation, on 1 and 2 ranks ---
eval_one="" eval_two=""
if run 1 eval --init "$work/one" --data "$work/prompts/val"; then
  eval_one=$(cat "$work/last.out")
else
  fail "eval of the GRPO checkpoint on prompts: $(tail -3 "$work/last.err")"
fi
if run 2 eval --init "$work/one" --data "$work/prompts/val"; then
  eval_two=$(cat "$work/last.out")
else
  fail "eval on 2 ranks: $(tail -3 "$work/last.err")"
fi
if python3 - "$work/one.jsonl" "$eval_one" "$eval_two" <<'PY'; then
import json, sys
final = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"eval"' in l][-1]
one, two = json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert final["step"] == 6, final
key = "rewards/answer_match/mean"
assert one[key] == two[key] == final[key], (one, two, final)
assert one["completions/mean_length"] == final["completions/mean_length"], (one, final)
assert one["prompts"] == final["prompts"] > 0, (one, final)
print(f"exact-answer accuracy {one[key]} on {one['prompts']:.0f} prompts")
PY
  pass "eval of a GRPO checkpoint on prompts: grpo's greedy accuracy at that step, on 1 and 2 ranks"
else
  fail "eval of the GRPO checkpoint on prompts: $eval_one $eval_two"
fi
run 1 eval --init "$work/one" --data "$work/prompts/val" --max-completion-length 99999999
rc=$?
if [[ $rc -eq 2 ]]; then
  pass "eval --max-completion-length out of range: exit 2"
else
  fail "eval --max-completion-length out of range (rc $rc): $(cat "$work/last.err")"
fi

# --- ZeRO-3: the engine gathers the sharded weights; the same completions and losses ---
run 2 "${grpo_args[@]}" --shard-parameters --ckpt-dir "$work/zero3" --metrics "$work/zero3.jsonl" \
  --log-completions "$work/zero3-samples.jsonl" ||
  fail "grpo with --shard-parameters (rc $?): $(tail -3 "$work/last.err")"
# The losses to 1e-5: the importance-sampling ratio reads the trainer's log-probabilities, which
# ZeRO-3's passes give to the last bits only (its weights gathered per layer group).
if cmp -s "$work/zero3-samples.jsonl" "$work/two-samples.jsonl" &&
  python3 - "$work/zero3.jsonl" "$work/two.jsonl" <<'PY'; then
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"kind":"train"' in l] for f in sys.argv[1:])
assert len(a) == len(b) == 6 and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b)), (a, b)
PY
  pass "ZeRO-3 (--shard-parameters): the completions and losses (1e-5) of the unsharded run"
else
  fail "ZeRO-3's completions or losses differ from the unsharded run's"
fi

# --- LoRA with --beta: step 1's KL is exactly 0 ---
run 2 "${base_args[@]}" "${similarity[@]}" --steps 2 --lora-rank 4 --beta 0.04 --ckpt-dir "$work/lora" \
  --metrics "$work/lora.jsonl" || fail "grpo with LoRA and --beta (rc $?): $(tail -3 "$work/last.err")"
if grep '"step":1,' "$work/lora.jsonl" | grep -q '"kl":0.0,' &&
  grep '"step":2,' "$work/lora.jsonl" | grep -q '"kl":'; then
  pass "LoRA, --beta 0.04: step 1's KL to the base model is exactly 0"
else
  fail "LoRA's KL at step 1: $(grep '"step":1,' "$work/lora.jsonl" | grep -o '"kl":[^,]*')"
fi

# --- killed while generating, scoring, updating; resumed: the uninterrupted run's weights ---
reference=$(digest "$work/two/step-00000006")
for point in grpo.generated grpo.scored train.update; do
  dir="$work/kill-$point"
  # --checkpoint-sync: step 2's checkpoint is in before step 3 starts, so the resumed run
  # continues from it (a background write still in flight at the kill, on a loaded machine,
  # would leave no checkpoint: the rerun is then a new run, which appends to the log and does
  # not trim another run's lines).
  L3_FAULT="$point@1#4=kill" run 2 "${grpo_args[@]}" --checkpoint-sync --ckpt-dir "$dir" \
    --log-completions "$dir.jsonl"
  run 2 "${grpo_args[@]}" --ckpt-dir "$dir" --log-completions "$dir.jsonl" ||
    fail "resume after $point (rc $?): $(tail -3 "$work/last.err")"
  if [[ -n $reference && "$(digest "$dir/step-00000006")" == "$reference" ]] &&
    cmp -s "$dir.jsonl" "$work/two-samples.jsonl"; then
    pass "killed at $point (step 4), resumed: weights and completions those of the uninterrupted run"
  else
    fail "killed at $point and resumed: not the uninterrupted run's"
  fi
done

# --- --num-iterations 2: two updates per generation batch, the old policy's log-probabilities
# kept; killed inside a cycle (step 6, resumed from step 3's checkpoint: the batch of step 3 read
# back from CKPT_DIR/rollouts) ---
mu_args=("${base_args[@]}" "${similarity[@]}" --steps 6 --num-iterations 2 --checkpoint-every 3)
run 2 "${mu_args[@]}" --ckpt-dir "$work/mu" --metrics "$work/mu.jsonl" ||
  fail "--num-iterations 2 (rc $?): $(tail -3 "$work/last.err")"
if python3 - "$work/mu.jsonl" <<'PY'; then
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
assert [s["iteration"] for s in steps] == [0, 1, 0, 1, 0, 1], [s.get("iteration") for s in steps]
for s in steps:
    if s["iteration"] == 0:
        assert s["clip_ratio/region_mean"] == 0.0, s  # the old policy is the current one
        assert s["time/generate_ms"] > 0
    else:
        assert s["time/generate_ms"] == 0.0
for a, b in zip(steps[0::2], steps[1::2]):
    assert a["reward"] == b["reward"]  # the same generation batch
PY
  pass "--num-iterations 2: a generation batch trains two steps, the first with a ratio of 1"
else
  fail "--num-iterations 2's steps"
fi
# The checkpoint of step 3 is written in the background: held back 2 s before its rename (rank
# 0), it is still in flight when step 5 saves its batch and prunes older ones (a prune that saw
# no checkpoint once deleted step 3's batch, which this checkpoint needs); rank 1 waits 4 s in
# step 5's update, so the checkpoint is in place when step 6 is killed.
L3_FAULT="ckpt.before_rename@0#1=sleep:2,train.update@1#5=sleep:4,train.update@1#6=kill" \
  run 2 "${mu_args[@]}" --ckpt-dir "$work/mu-kill"
run 2 "${mu_args[@]}" --ckpt-dir "$work/mu-kill" ||
  fail "resume inside a cycle (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(digest "$work/mu/step-00000006")" &&
  "$(digest "$work/mu-kill/step-00000006")" == "$(digest "$work/mu/step-00000006")" ]] &&
  grep -q "step-00000003" "$work/last.err"; then
  pass "--num-iterations 2, killed inside a cycle and resumed from step 3: the uninterrupted run's weights"
else
  fail "--num-iterations 2 resumed inside a cycle: not the uninterrupted run's weights"
fi

# --- verifiers that fail ---
cat >"$work/verifier.sh" <<'SH'
# answers 1 for a completion that is the record's answer, else 0; FAIL=... makes it misbehave
n=0
while IFS= read -r line; do
  n=$((n + 1))
  if [ "$n" -ge 20 ]; then
    case "$FAIL" in
      die) exit 3 ;;
      hang) sleep 60 ;;
      garbage) echo 'not json'; continue ;;
      nan) echo '{"reward": 1e999}'; continue ;;
    esac
  fi
  echo '{"reward": 0.5}'
done
SH
for mode in die hang garbage nan; do
  dir="$work/verifier-$mode"
  FAIL=$mode run 2 "${base_args[@]}" --steps 6 --checkpoint-every 2 \
    --reward-command "sh $work/verifier.sh" \
    --reward-timeout 2 --ckpt-dir "$dir"
  rc=$?
  message=$(grep -h 'reward-command' "$work/last.err" | head -1)
  if [[ $rc -eq 2 && $message == *"sh $work/verifier.sh"* && $message == *"prompt "* &&
    -d "$dir/step-00000002" ]]; then
    pass "a verifier that fails ($mode): exit 2, one line naming it and the prompt; step 2's checkpoint kept"
  else
    fail "a verifier that fails ($mode): rc $rc, '$message'"
  fi
done

finish_checks "GRPO checks"
