#!/usr/bin/env bash
# Multi-turn GRPO (--environment) through the real program under mpiexec, with the calculator
# of examples/environments (a tool the policy calls by writing `calc EXPRESSION`, answered as an
# "ipython" message) on arithmetic prompts, from a tiny model SFT-trained on a few transcripts
# of that format (prep sft with the "ipython" role):
#   2 ranks run step 1's episodes of 1 rank, byte for byte in --log-completions, and follow its
#   losses;
#   an outsider recomputes from the log alone which tokens the loss counted (the policy's turns:
#   the others decode to the environment's messages in the chat template) and every advantage;
#   a run killed during an episode (at a policy turn's end) and resumed ends with the
#   uninterrupted run's weights and log, bit for bit;
#   an environment that fails stops the run with exit 2 and one line naming the command, the
#   episode and the turn, the checkpoint written before kept.
#
#   grpo_environment_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
calculator="$(cd "$(dirname "$0")/../../examples/environments" && pwd)/calculator.py"
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-grpo-env-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/mpi_runs.sh
source "$(dirname "$0")/../support/mpi_runs.sh"

# --- the task: "What is A+B?" (or -, *), the transcripts a calculator call then the answer ---
python3 - "$work" <<'PY'
import json, random, sys
rng = random.Random(5)
def problem():
    a, b, op = rng.randint(2, 19), rng.randint(2, 9), rng.choice("+-*")
    return f"{a}{op}{b}", str(eval(f"{a}{op}{b}"))
with open(f"{sys.argv[1]}/transcripts.jsonl", "w") as out:
    for _ in range(96):
        expression, value = problem()
        out.write(json.dumps({"messages": [
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": f"calc {expression}"},
            {"role": "ipython", "content": value},
            {"role": "assistant", "content": value}]}) + "\n")
with open(f"{sys.argv[1]}/prompts.jsonl", "w") as out:
    for _ in range(32):
        expression, value = problem()
        out.write(json.dumps({"prompt": f"What is {expression}?", "answer": value}) + "\n")
rng = random.Random(7)  # the accuracy's prompts: 2/3 to train on, 1/3 held out
with open(f"{sys.argv[1]}/gain.jsonl", "w") as out:
    for _ in range(96):
        expression, value = problem()
        out.write(json.dumps({"prompt": f"What is {expression}?", "answer": value}) + "\n")
PY
if "$bin" prep sft --input "$work/transcripts.jsonl" --tokenizer bytes --output "$work/sft" \
  >"$work/last.out" 2>&1 &&
  "$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
    >>"$work/last.out" 2>&1 &&
  "$bin" prep prompts --input "$work/gain.jsonl" --tokenizer bytes --output "$work/gain" \
    --val-fraction 0.33 >>"$work/last.out" 2>&1; then
  pass "prep sft takes transcripts with tool results (role ipython); prep prompts the prompts"
else
  fail "prep: $(cat "$work/last.out")"
  exit 1
fi
run 1 sft --model tiny --data "$work/sft" --steps 200 --seq-len 128 --global-batch 8 --lr 3e-3 \
  --ckpt-dir "$work/sft-ckpt" --log-every 0 --no-progress || {
  cat "$work/last.err"
  echo "the SFT run failed"
  exit 1
}

args=(grpo --init "$work/sft-ckpt" --data "$work/prompts" --environment "python3 $calculator"
  --max-turns 3 --seq-len 128 --global-batch 4 --num-generations 4 --micro-batch 4
  --max-completion-length 48 --temperature 1.0 --lr 1e-3 --steps 4 --checkpoint-every 1
  --log-every 0 --no-progress --deterministic)

# --- 1 rank and 2 ranks ---
run 1 "${args[@]}" --ckpt-dir "$work/one" --metrics "$work/one.jsonl" \
  --log-completions "$work/one-samples.jsonl" ||
  fail "grpo --environment on 1 rank (rc $?): $(tail -3 "$work/last.err")"
run 2 "${args[@]}" --ckpt-dir "$work/two" --metrics "$work/two.jsonl" \
  --log-completions "$work/two-samples.jsonl" ||
  fail "grpo --environment on 2 ranks (rc $?): $(tail -3 "$work/last.err")"
if cmp -s <(grep '"step":1,' "$work/one-samples.jsonl") <(grep '"step":1,' "$work/two-samples.jsonl") &&
  [[ $(grep -c '"step":1,' "$work/one-samples.jsonl") -eq 16 ]]; then
  pass "step 1: 2 ranks run the 16 episodes of 1 rank, byte for byte"
else
  fail "step 1's episodes on 1 and 2 ranks"
fi
if python3 - "$work/one.jsonl" "$work/two.jsonl" "$work/one-samples.jsonl" <<'PY'; then
import json, math, sys
from collections import defaultdict
one = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
two = [json.loads(l) for l in open(sys.argv[2]) if '"kind":"train"' in l]
assert len(one) == len(two) == 4, (len(one), len(two))
for a, b in zip(one, two):
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * max(1.0, abs(a["loss"])), (a["loss"], b["loss"])
    for key in ("turns/mean", "turns/max", "tools/call_frequency", "tokens_per_turn",
                "rewards/environment/mean", "time/environment_share", "time/generate_share"):
        assert key in a, key
    # The generator prefills the environment's messages against its cache; the trainer runs
    # the whole conversation: fp32 apart (single turns: below 1e-5).
    assert a["logp_mismatch"] < 1e-4, a["logp_mismatch"]
assert one[0]["tools/call_frequency"] > 0.5, one[0]  # the SFT taught the format
assert one[0]["turns/mean"] > 1.5, one[0]
# The outsider's view: the bytes tokenizer's ids (0-255 bytes, then Llama 3's special tokens
# from 256), the policy's tokens and the environment's told apart by "policy".
NAMED = ["begin_of_text", "end_of_text", "reserved_special_token_0", "reserved_special_token_1",
         "finetune_right_pad_id", "reserved_special_token_2", "start_header_id", "end_header_id",
         "eom_id", "eot_id", "python_tag"]
def special(i):  # Llama 3.1's names, the rest numbered from 3
    return "<|%s|>" % (NAMED[i - 256] if i - 256 < len(NAMED) else f"reserved_special_token_{i - 264}")
def text(ids):
    out, raw = [], bytearray()
    for i in ids:
        if i < 256:
            raw.append(i)
        else:
            out.append(raw.decode("utf-8", "replace")); raw = bytearray()
            out.append(special(i))
    out.append(raw.decode("utf-8", "replace"))
    return "".join(out)
samples = [json.loads(l) for l in open(sys.argv[3])]
groups = defaultdict(list)
for s in samples:
    ids, policy, messages = s["ids"], s["policy"], s["messages"]
    assert len(policy) == len(ids)
    # Runs of the policy's and the environment's tokens, in order.
    runs = []
    for i, p in zip(ids, policy):
        if runs and runs[-1][0] == p:
            runs[-1][1].append(i)
        else:
            runs.append((p, [i]))
    replies = messages[len(messages) - (2 * s["turns"] - 1):]  # after the prompt's messages
    assert [p for p, _ in runs] == [1, 0] * (s["turns"] - 1) + [1], (runs, s["turns"])
    for k, (p, run) in enumerate(runs):
        if p == 1:  # a policy turn: its message's content, then its stop token (not truncated)
            assert replies[k]["role"] == "assistant"
            assert text(run) in (replies[k]["content"] + "<|eot_id|>", replies[k]["content"]), (run, replies[k])
        else:  # the environment's message in the chat template, then the assistant's header
            m = replies[k]
            assert m["role"] == "ipython"
            assert text(run) == (f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
                                 f"{m['content'].strip()}<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n"), text(run)
    assert s["tool_calls"] == s["turns"] - 1
    # The calculator's reward: the last turn, stripped, is the answer.
    assert s["rewards/environment"] == (1.0 if messages[-1]["content"].strip() == s["record"]["answer"] else 0.0)
    assert s["reward"] == s["rewards/environment"]
    groups[(s["step"], s["prompt_index"])].append(s)
for g in groups.values():
    assert len(g) == 4
    r = [s["reward"] for s in g]
    mean = sum(r) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 3)
    for s in g:
        assert abs(s["advantage"] - (s["reward"] - mean) / (std + 1e-4)) < 1e-9, s
# completions/mean_length counts the policy's tokens only
for step in one:
    lengths = [sum(s["policy"]) for s in samples if s["step"] == step["step"]]
    assert abs(step["completions/mean_length"] - sum(lengths) / len(lengths)) < 1e-9
PY
  pass "metrics on 1 and 2 ranks; from the log: the policy's tokens, the environment's as its messages, every advantage"
else
  fail "the episodes' metrics or log"
fi

# --- report: the episodes' chart (turns per episode, tool results dashed) ---
if "$bin" report "$work/one.jsonl" --output "$work/report.html" >/dev/null 2>&1 &&
  python3 - "$work/report.html" <<'PY'; then
import re, sys
html = open(sys.argv[1], encoding="utf-8").read()
chart = re.search(r'<svg class="chart" data-phase="grpo" data-metric="turns/mean"(.*?)</svg>', html, re.S)
assert chart and "training turns/mean" in chart.group(1) and "tool results" in chart.group(1)
assert "no --environment" not in html
PY
  pass "report: the episodes' chart, turns and tool results"
else
  fail "report of a run with an environment"
fi

# --- split ranks (--generation-ranks 1, on-policy): the environment on the generating rank ---
run 3 "${args[@]}" --generation-ranks 1 --max-staleness 0 --ckpt-dir "$work/split" \
  --log-completions "$work/split.jsonl" ||
  fail "grpo --environment --generation-ranks 1 (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(digest "$work/two/step-00000004")" &&
  "$(digest "$work/split/step-00000004")" == "$(digest "$work/two/step-00000004")" ]] &&
  python3 - "$work/split.jsonl" "$work/two-samples.jsonl" <<'PY'; then
import json, sys
keys = ("step", "prompt_index", "sample", "ids", "policy", "messages", "turns", "reward", "advantage")
split = [json.loads(l) for l in open(sys.argv[1])]
sync = [json.loads(l) for l in open(sys.argv[2])]
assert len(split) == len(sync) == 64, (len(split), len(sync))
for a, b in zip(split, sync):
    assert all(a[k] == b[k] for k in keys), (a, b)
PY
  pass "1 generating + 2 training ranks, on-policy: the 2-rank run's episodes and weights"
else
  fail "--generation-ranks 1 with an environment: not the synchronous run's weights"
fi

# --- killed at a policy turn's end (its 50th on rank 1: in step 4), resumed: the uninterrupted run's ---
reference=$(digest "$work/two/step-00000004")
L3_FAULT="grpo.turn@1#50=kill" run 2 "${args[@]}" --checkpoint-sync --ckpt-dir "$work/kill" \
  --log-completions "$work/kill.jsonl"
killed_at=$(find "$work/kill" -maxdepth 1 -name 'step-*' 2>/dev/null | wc -l)
run 2 "${args[@]}" --ckpt-dir "$work/kill" --log-completions "$work/kill.jsonl" ||
  fail "resume after the kill (rc $?): $(tail -3 "$work/last.err")"
if [[ -n $reference && $killed_at -ge 1 && $killed_at -lt 4 &&
  "$(digest "$work/kill/step-00000004")" == "$reference" ]] &&
  cmp -s "$work/kill.jsonl" "$work/two-samples.jsonl"; then
  pass "killed during an episode ($killed_at checkpoints in), resumed: the uninterrupted run's weights and episodes"
else
  fail "killed during an episode ($killed_at checkpoints in) and resumed: not the uninterrupted run's"
fi

# --- --num-iterations 2: a batch of episodes trains two steps; killed in step 4 (the second of
# its batch), resumed from step 3's checkpoint: the batch's conversations read back from
# CKPT_DIR/rollouts, the uninterrupted run's weights ---
run 2 "${args[@]}" --num-iterations 2 --ckpt-dir "$work/mu" ||
  fail "--num-iterations 2 (rc $?): $(tail -3 "$work/last.err")"
L3_FAULT="train.update@1#4=kill" run 2 "${args[@]}" --num-iterations 2 --checkpoint-sync \
  --ckpt-dir "$work/mu-kill"
run 2 "${args[@]}" --num-iterations 2 --ckpt-dir "$work/mu-kill" ||
  fail "resume inside a batch (rc $?): $(tail -3 "$work/last.err")"
if [[ -n "$(digest "$work/mu/step-00000004")" &&
  "$(digest "$work/mu-kill/step-00000004")" == "$(digest "$work/mu/step-00000004")" ]] &&
  grep -q "step-00000003" "$work/last.err" && grep -q '"policy"' "$work"/mu-kill/rollouts/*; then
  pass "--num-iterations 2, killed inside a batch of episodes and resumed: the uninterrupted run's weights"
else
  fail "--num-iterations 2 resumed inside a batch of episodes: not the uninterrupted run's weights"
fi

# --- an environment that fails in step 2 (at its 17th episode's first turn; a step has 16 on
# one rank): exit 2, one line, step 1's checkpoint kept ---
cat >"$work/flaky.py" <<PY
import json, subprocess, sys
calculator = subprocess.Popen([sys.executable, "$calculator"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
episodes = 0
for line in sys.stdin:
    episodes += json.loads(line)["turn"] == 1
    if episodes == 17:
        print("oops", flush=True)
        continue
    calculator.stdin.write(line); calculator.stdin.flush()
    print(calculator.stdout.readline(), end="", flush=True)
PY
flaky=("${args[@]}")
flaky[6]="python3 $work/flaky.py"
run 1 "${flaky[@]}" --ckpt-dir "$work/flaky"
rc=$?
error=$(grep -v '^\[' "$work/last.err" | grep 'error' | head -n 1)
if [[ $rc -eq 2 && -d "$work/flaky/step-00000001" ]] &&
  [[ $error == *'--environment "python3 '*'flaky.py", prompt '*' of '*'(sample '*'), turn '*": the answer is not JSON: 'oops'"* ]]; then
  pass "a failing environment: exit 2, one line naming it, the episode and the turn; step 1's checkpoint kept"
else
  fail "a failing environment (rc $rc): $error"
fi
# --- SIGTERM while the environment thinks: the wait ends at once, exit 75 ---
stuck=("${args[@]}")
stuck[6]="read -r line; touch '$work/asked'; sleep 60"
rm -f "$work/asked"
"$bin" "${stuck[@]}" --ckpt-dir "$work/stuck" >"$work/stuck.out" 2>"$work/stuck.err" &
pid=$!
for ((t = 0; t < 300; t++)); do
  [[ -e "$work/asked" ]] && break
  sleep 0.1
done
started=$(date +%s)
kill -TERM "$pid"
wait "$pid"
rc=$?
if [[ $rc -eq 75 && $(($(date +%s) - started)) -le 10 ]] &&
  grep -q 'stopped by a signal while --environment ".*" answered prompt .* turn 1' "$work/stuck.err"; then
  pass "SIGTERM while the environment thinks: exit 75 at once, naming it"
else
  fail "SIGTERM while the environment thinks (rc $rc): $(grep -v '^\[' "$work/stuck.err" | tail -2)"
fi

# --- the guessing game: user turns ("higher", "lower"), at most --max-turns guesses ---
guess_number="$(dirname "$calculator")/guess_number.py"
for n in 7 42 63 88; do
  echo "{\"prompt\": \"Guess my number from 1 to 100.\", \"answer\": $n}"
done >"$work/guess.jsonl"
"$bin" prep prompts --input "$work/guess.jsonl" --tokenizer bytes --output "$work/guess" >/dev/null 2>&1
run 1 grpo --init "$work/sft-ckpt" --data "$work/guess" --environment "python3 $guess_number" \
  --max-turns 4 --seq-len 160 --global-batch 4 --num-generations 2 --max-completion-length 96 \
  --steps 1 --log-completions "$work/guess-samples.jsonl" --log-every 0 --no-progress ||
  fail "grpo with guess_number.py (rc $?): $(tail -3 "$work/last.err")"
if python3 - "$work/guess-samples.jsonl" <<'PY'; then
import json, sys
episodes = [json.loads(l) for l in open(sys.argv[1])]
assert len(episodes) == 8
for e in episodes:
    replies = [m for m in e["messages"][1:] if m["role"] != "assistant"]
    assert all(m["role"] == "user" for m in replies), replies
    assert all(m["content"] in ("higher", "lower", "a number, please") for m in replies), replies
    assert 1 <= e["turns"] <= 4, e["turns"]
    # a reply after each guess but the last (one that did not fit ends the episode truncated)
    assert len(replies) == e["turns"] - 1 or (e["truncated"] and len(replies) < e["turns"]), e
    assert e["reward"] == 0.0 or e["reward"] >= 0.1
assert any(e["turns"] > 1 for e in episodes)
PY
  pass "guess_number.py: the user's replies between the policy's guesses, at most 4 turns"
else
  fail "episodes with guess_number.py"
fi

# --- the calculator's GRPO raises the held-out accuracy: greedy episodes (exact answers) and
# sampled ones, evaluated at step 0 (--eval-on-start) and every 20 steps ---
run 2 grpo --init "$work/sft-ckpt" --data "$work/gain/train" --val-data "$work/gain/val" \
  --eval-every 20 --eval-on-start --environment "python3 $calculator" --max-turns 3 \
  --seq-len 128 --global-batch 16 --num-generations 8 --micro-batch 8 \
  --max-completion-length 48 --temperature 0.7 --lr 5e-4 --steps 60 --ckpt-dir "$work/gain-ckpt" \
  --metrics "$work/gain.jsonl" --log-every 0 --no-progress --deterministic ||
  fail "grpo for the accuracy (rc $?): $(tail -3 "$work/last.err")"
if gain=$(python3 - "$work/gain.jsonl" <<'PY'
import json, sys
evals = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"eval"' in l]
assert [e["step"] for e in evals] == [0, 20, 40, 60], [e["step"] for e in evals]
first, last = evals[0], evals[-1]
assert last["reward"] > first["reward"], (first["reward"], last["reward"])
assert last["reward_sampled"] > first["reward_sampled"], (first["reward_sampled"], last["reward_sampled"])
print(f"greedy {100 * first['reward']:.1f}% -> {100 * last['reward']:.1f}%, sampled "
      f"{100 * first['reward_sampled']:.1f}% -> {100 * last['reward_sampled']:.1f}% "
      f"of {first['prompts']:.0f} prompts")
PY
); then
  pass "the held-out exact-answer accuracy rises with GRPO on the calculator: $gain"
else
  fail "the held-out accuracy with the calculator: $gain"
fi
finish_checks "multi-turn GRPO checks"
