#!/usr/bin/env bash
# Asynchronous GRPO (--generation-ranks, --max-staleness) on the tiny reversal task, 4 steps:
#   - 1 generating + 2 training ranks with --max-staleness 0 end with the synchronous 2-rank
#     run's weights and log its completions byte for byte, also with LoRA over a frozen model
#     sharded on the training ranks and a KL term;
#   - with the default lag (1) the steps report the staleness, the generating ranks' work and the
#     weights sent; 2 generating ranks give the 1-rank generation's weights and completions;
#   - a training rank killed after a checkpoint, a generating rank killed while scoring, and a
#     SIGUSR1 stop (exit 75) resume to the uninterrupted run's weights and completions log;
#   - a verifier failing on a generating rank is one error line, exit 2; bad splits are exit 2.
# Usage:
#   grpo_async_test.sh LLAMA3_HPC MPIEXEC
set -u

bin=$1
mpiexec=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-grpo-async-XXXXXX")
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
write_reversal_prompts "$work/sft.jsonl" "$work/prompts.jsonl"
"$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
  >"$work/last.out" 2>&1 || {
  cat "$work/last.out"
  exit 1
}
run 1 sft --model tiny --data "$work/sft" --steps 16 --seq-len 64 --global-batch 8 --lr 3e-3 \
  --ckpt-dir "$work/sft-ckpt" --log-every 0 --no-progress || {
  cat "$work/last.err"
  echo "the SFT run failed"
  exit 1
}
cat >"$work/similarity.py" <<'PY'
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    answer, completion = r["record"]["answer"], r["completion"].strip()
    same = sum(1 for a, b in zip(answer, completion) if a == b)
    print(json.dumps({"reward": same / max(len(answer), len(completion), 1)}), flush=True)
PY
args=(grpo --init "$work/sft-ckpt" --data "$work/prompts" --reward-match answer
  --reward-command "python3 $work/similarity.py" --seq-len 64 --global-batch 4
  --num-generations 4 --micro-batch 4 --max-completion-length 16 --lr 1e-3 --log-every 0
  --no-progress --deterministic --steps 4 --checkpoint-every 2)
step4() { digest "$1/step-00000004"; }

# --- on-policy on split ranks: the synchronous run, bit for bit ---
run 2 "${args[@]}" --ckpt-dir "$work/sync" --log-completions "$work/sync.jsonl" ||
  fail "synchronous run (rc $?): $(tail -3 "$work/last.err")"
run 3 "${args[@]}" --generation-ranks 1 --max-staleness 0 --ckpt-dir "$work/s0" \
  --log-completions "$work/s0.jsonl" || fail "--max-staleness 0 (rc $?): $(tail -3 "$work/last.err")"
# The asynchronous log has two fields more (policy_version, logprobs): the rest is the same.
same_completions() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
for x in a:
    assert x.pop("policy_version") == max(0, x["step"] - 1) and len(x.pop("logprobs")) == len(x["ids"])
assert len(a) == 64 and a == b
PY
}
if [[ -n "$(step4 "$work/sync")" && "$(step4 "$work/s0")" == "$(step4 "$work/sync")" ]] &&
  same_completions "$work/s0.jsonl" "$work/sync.jsonl"; then
  pass "1 generating + 2 training ranks, --max-staleness 0: the synchronous run's weights and completions"
else
  fail "--max-staleness 0 on split ranks is not the synchronous run"
fi

# LoRA over a frozen model sharded on the training ranks (--shard-parameters), with a KL term:
# the generating rank takes the frozen model from both training ranks' pieces once and the
# adapters each step; on-policy, the synchronous run's adapters and completions.
lora=(--lora-rank 4 --lora-alpha 8 --shard-parameters --beta 0.04)
run 2 "${args[@]}" "${lora[@]}" --ckpt-dir "$work/lsync" --log-completions "$work/lsync.jsonl" ||
  fail "synchronous LoRA run (rc $?): $(tail -3 "$work/last.err")"
run 3 "${args[@]}" "${lora[@]}" --generation-ranks 1 --max-staleness 0 --ckpt-dir "$work/ls0" \
  --log-completions "$work/ls0.jsonl" ||
  fail "LoRA, --shard-parameters, --max-staleness 0 (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(step4 "$work/lsync")" && "$(step4 "$work/ls0")" == "$(step4 "$work/lsync")" ]] &&
  same_completions "$work/ls0.jsonl" "$work/lsync.jsonl" && ! cmp -s "$work/lsync.jsonl" "$work/sync.jsonl"; then
  pass "LoRA, the frozen model sharded, --beta: --max-staleness 0 gives the synchronous run"
else
  fail "LoRA with --shard-parameters on split ranks is not the synchronous run"
fi

# --- the default lag of 1: its metrics; 2 generating ranks give the same bits ---
run 3 "${args[@]}" --generation-ranks 1 --ckpt-dir "$work/s1" --metrics "$work/s1-metrics.jsonl" \
  --log-completions "$work/s1.jsonl" || fail "--generation-ranks 1 (rc $?): $(tail -3 "$work/last.err")"
if python3 - "$work/s1-metrics.jsonl" "$work/s1.jsonl" <<'PY'; then
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
assert [s["staleness"] for s in steps] == [0, 1, 1, 1], [s["staleness"] for s in steps]
assert [s["generation/policy_version"] for s in steps] == [0, 0, 1, 2]
for s in steps:
    assert s["weights/bytes"] == 4 * 164160, s["weights/bytes"]  # the tiny model's fp32 weights
    for key in ("generation/generate_ms", "generation/score_ms", "generation/idle_ms",
                "generation/transfer_ms", "generation/weights_ms", "time/generation_wait_ms",
                "time/weights_ms"):
        assert key in s and s[key] >= 0, key
# Off-policy from step 2: the ratio against the generator's log-probabilities moves and clips.
assert steps[0]["clip_ratio/region_mean"] == 0.0
assert any(s["clip_ratio/region_mean"] > 0 for s in steps[1:])
log = [json.loads(l) for l in open(sys.argv[2])]
assert len(log) == 64
for c in log:
    assert c["policy_version"] == max(0, c["step"] - 2), c
    assert len(c["logprobs"]) == len(c["ids"]) == len(c["behaviour_logprobs"])
    assert all(p <= 0 for p in c["logprobs"] + c["behaviour_logprobs"])
# An outsider's importance-sampling ratios (TRL's sequence_mask, clip max 3), from the log alone:
# exp of the sum over a completion of behaviour (the trainer's pass of the generating policy)
# minus sampled (the generator's) log-probabilities, 0 above 3; the step's min, mean and max.
import math
for s in steps:
    w, tokens, masked = [], 0, 0
    for c in (c for c in log if c["step"] == s["step"]):
        r = math.exp(sum(b - p for b, p in zip(c["behaviour_logprobs"], c["logprobs"])))
        w.append(r if r <= 3.0 else 0.0)
        tokens += len(c["ids"])
        masked += len(c["ids"]) if r > 3.0 else 0
    got = [s["sampling/importance_sampling_ratio/" + k] for k in ("min", "mean", "max")]
    want = [min(w), sum(w) / len(w), max(w)]
    assert all(abs(a - b) <= 1e-12 for a, b in zip(got, want)), (s["step"], got, want)
    assert abs(s["sampling/importance_sampling_masked"] - masked / tokens) <= 1e-12, s["step"]
PY
  pass "--max-staleness 1: staleness, versions, weights, times; the log's importance ratios recomputed"
else
  fail "--max-staleness 1's metrics or completions log"
fi
run 4 "${args[@]}" --generation-ranks 2 --ckpt-dir "$work/s1g2" --log-completions "$work/s1g2.jsonl" ||
  fail "--generation-ranks 2 (rc $?): $(tail -3 "$work/last.err")"
reference=$(step4 "$work/s1")
if [[ -n $reference && "$(step4 "$work/s1g2")" == "$reference" ]] &&
  cmp -s "$work/s1g2.jsonl" "$work/s1.jsonl" && ! cmp -s "$work/s1.jsonl" "$work/sync.jsonl"; then
  pass "2 generating ranks: the 1-rank generation's weights and completions"
else
  fail "2 generating ranks differ from 1"
fi

# --- killed or stopped, resumed: the uninterrupted run (a training rank after step 2's
# checkpoint; a generating rank scoring step 4's batch, the batch of step 3 in CKPT_DIR/rollouts;
# SIGUSR1 to a training rank before step 3) ---
for spec in "train.update@1#3=kill" "grpo.scored@2#4=kill" "train.step@1#3=raise:USR1"; do
  dir="$work/kill-${spec%%@*}"
  L3_FAULT="$spec" run 3 "${args[@]}" --generation-ranks 1 --checkpoint-sync --ckpt-dir "$dir" \
    --log-completions "$dir.jsonl"
  killed=$?
  run 3 "${args[@]}" --generation-ranks 1 --ckpt-dir "$dir" --log-completions "$dir.jsonl" ||
    fail "resume after $spec (rc $?): $(tail -3 "$work/last.err")"
  # SIGUSR1 on a training rank: both groups stop at step 2, its checkpoint written (exit 75).
  [[ $spec == *USR1 && ($killed -ne 75 || ! -d "$dir/step-00000002") ]] && killed=0
  if [[ $killed -ne 0 && "$(step4 "$dir")" == "$reference" ]] && cmp -s "$dir.jsonl" "$work/s1.jsonl"; then
    pass "killed ($spec), resumed: the uninterrupted run's weights and completions"
  else
    fail "killed ($spec, rc $killed) and resumed: not the uninterrupted run's"
  fi
done

# --- --num-iterations 2: a lag of whole cycles (a batch trains two steps) ---
# On-policy on split ranks: the synchronous run. With the lag of 1 the batch of steps 3-4 comes
# from the initial policy, generated while steps 1-2 trained; a training rank killed in step 4,
# after the checkpoint of step 3 (inside the cycle), resumes to the uninterrupted run.
cycles=("${args[@]}" --num-iterations 2)
run 2 "${cycles[@]}" --ckpt-dir "$work/msync" --log-completions "$work/msync.jsonl" ||
  fail "synchronous --num-iterations 2 (rc $?): $(tail -3 "$work/last.err")"
run 3 "${cycles[@]}" --generation-ranks 1 --max-staleness 0 --ckpt-dir "$work/ms0" \
  --log-completions "$work/ms0.jsonl" ||
  fail "--num-iterations 2, --max-staleness 0 (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(step4 "$work/msync")" && "$(step4 "$work/ms0")" == "$(step4 "$work/msync")" ]] &&
  python3 - "$work/ms0.jsonl" "$work/msync.jsonl" <<'PY'; then
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
for x in a:  # cycles start at steps 1 and 3 (1-based), on-policy: versions 0 and 2
    assert x.pop("policy_version") == x["step"] - 1 and len(x.pop("logprobs")) == len(x["ids"])
assert len(a) == 32 and a == b
PY
  pass "--num-iterations 2, --max-staleness 0: the synchronous run's weights and completions"
else
  fail "--num-iterations 2 on split ranks, on-policy, is not the synchronous run"
fi
# args ends with "--checkpoint-every 2": here 3, inside the second cycle.
lagged=("${args[@]:0:${#args[@]}-1}" 3 --num-iterations 2 --generation-ranks 1)
run 3 "${lagged[@]}" --ckpt-dir "$work/ms1" --metrics "$work/ms1-metrics.jsonl" \
  --log-completions "$work/ms1.jsonl" || fail "--num-iterations 2, lag 1 (rc $?): $(tail -3 "$work/last.err")"
L3_FAULT="train.update@1#4=kill" run 3 "${lagged[@]}" --checkpoint-sync --ckpt-dir "$work/ms1k" \
  --log-completions "$work/ms1k.jsonl"
killed=$?
run 3 "${lagged[@]}" --ckpt-dir "$work/ms1k" --log-completions "$work/ms1k.jsonl" ||
  fail "--num-iterations 2 resumed inside a cycle (rc $?): $(tail -3 "$work/last.err")"
if [[ $killed -ne 0 && -n "$(step4 "$work/ms1")" && "$(step4 "$work/ms1k")" == "$(step4 "$work/ms1")" ]] &&
  cmp -s "$work/ms1k.jsonl" "$work/ms1.jsonl" && grep -q "resumed at step 3" "$work/last.err" &&
  python3 - "$work/ms1-metrics.jsonl" "$work/ms1.jsonl" <<'PY'; then
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
assert [s["staleness"] for s in steps] == [0, 1, 2, 3], [s["staleness"] for s in steps]
assert [s["iteration"] for s in steps] == [0, 1, 0, 1]
assert [s["weights/bytes"] > 0 for s in steps] == [True, False, True, False]
log = [json.loads(l) for l in open(sys.argv[2])]
assert sorted({c["step"] for c in log}) == [1, 3] and all(c["policy_version"] == 0 for c in log)
PY
  pass "--num-iterations 2 with a lag of one cycle: staleness, a kill inside a cycle resumed bit for bit"
else
  fail "--num-iterations 2 with a lag (rc $killed): metrics, or the resumed run is not the uninterrupted one"
fi

# --- failures ---
cat >"$work/bad.py" <<'PY'
import json, sys
for n, line in enumerate(sys.stdin):
    print("not json" if n == 19 else json.dumps({"reward": 0.5}), flush=True)
PY
bad=("${args[@]}")
bad[8]="python3 $work/bad.py"
run 3 "${bad[@]}" --generation-ranks 1 --ckpt-dir "$work/bad"
rc=$?
if [[ $rc -eq 2 && $(grep -c '^error:' "$work/last.err") -eq 1 ]] &&
  grep -q 'bad.py.*not JSON' "$work/last.err"; then
  pass "a verifier failing on a generating rank: one error line, exit 2"
else
  fail "a failing verifier on a generating rank (rc $rc): $(cat "$work/last.err")"
fi
run 2 "${args[@]}" --generation-ranks 2 --ckpt-dir "$work/none"
rc=$?
if [[ $rc -eq 2 ]] && grep -q 'leaves no rank to train' "$work/last.err"; then
  pass "--generation-ranks as many as the ranks: exit 2"
else
  fail "--generation-ranks 2 on 2 ranks (rc $rc): $(cat "$work/last.err")"
fi
run 2 "${args[@]}" --max-staleness 1 --ckpt-dir "$work/none"
rc=$?
if [[ $rc -eq 2 ]] && grep -q 'needs --generation-ranks' "$work/last.err"; then
  pass "--max-staleness without --generation-ranks: exit 2"
else
  fail "--max-staleness alone (rc $rc): $(cat "$work/last.err")"
fi
finish_checks "asynchronous GRPO checks"
