#!/usr/bin/env bash
# `grpo` on the CUDA backend through the real program; exits 77 (skipped) without a CUDA device.
# A tiny checkpoint (2 SFT steps on the CPU) trains 3 GRPO steps on the device (the engine's
# bf16 generation, the policy_loss op, the lm_head's entropy, the bf16 backward) and on the CPU
# from the same start: step 1's completions and rewards follow the CPU's (bf16 may part a
# sampled sequence at a near-tie, rarely), its loss, entropy and the generator's agreement with
# the trainer (logp_mismatch, bf16's size; the importance-sampling ratios near 1, none masked)
# are those of a working step, and the run checkpoints. With MPIEXEC, asynchronous GRPO on the
# device: 1 generating + 1 training rank with --max-staleness 0 generate the device's synchronous
# run's step-1 completions token for token, from weights sent in bf16 (half the bytes; the
# generating rank's bf16 model holds what the training rank's does, the master weights rounded
# to nearest even), and train on them: the loss and entropy agree to fp32 summation order (not
# bit for bit on the device, unlike the CPU: the training pass's sums come out in another order,
# entropy 1e-9 apart on the emulation; over 3 steps all 24 completions were the same there).
# Multi-turn episodes with an environment: step 1's episodes follow the CPU's.
#   grpo_test.sh PATH/TO/llama3-hpc [MPIEXEC]
set -uo pipefail
bin=${1:?usage: grpo_test.sh LLAMA3_HPC [MPIEXEC]}
mpiexec=${2:-}
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
sed 's/"completion"/"answer"/' "$work/train.jsonl" >"$work/prompts.jsonl"
"$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train" >/dev/null ||
  fail "prep sft"
"$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/prompts" \
  >/dev/null || fail "prep prompts"
"$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 --steps 2 --lr 1e-3 \
  --ckpt-dir "$work/ck" --no-progress --backend cpu >"$work/sft.log" 2>&1 || fail "sft: $(tail -3 "$work/sft.log")"
cat >"$work/length.py" <<'PY'
import json, sys
for line in sys.stdin:  # a graded reward: short completions score higher
    print(json.dumps({"reward": 1.0 / (1 + len(json.loads(line)["completion"]))}), flush=True)
PY
grpo_args=(grpo --init "$work/ck" --data "$work/prompts" --reward-match answer
  --reward-command "python3 $work/length.py" --steps 3 --seq-len 64 --global-batch 2
  --num-generations 4 --max-completion-length 12 --temperature 0.7 --lr 1e-3 --log-every 0
  --no-progress)
for backend in cpu cuda; do
  "$bin" "${grpo_args[@]}" --backend "$backend" --ckpt-dir "$work/ck-$backend" \
    --metrics "$work/$backend-metrics.jsonl" --log-completions "$work/$backend.jsonl" \
    >"$work/$backend.log" 2>&1 || fail "grpo on $backend: $(tail -3 "$work/$backend.log")"
done
[[ -d "$work/ck-cuda/step-00000003" ]] || fail "no checkpoint of the device's run"
python3 - "$work/cpu.jsonl" "$work/cuda.jsonl" "$work/cpu-metrics.jsonl" "$work/cuda-metrics.jsonl" <<'PY' || fail "the device's steps"
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["step"] == 1]
gpu = [json.loads(l) for l in open(sys.argv[2]) if json.loads(l)["step"] == 1]
assert len(cpu) == len(gpu) == 8, (len(cpu), len(gpu))
same = sum(c["ids"] == g["ids"] for c, g in zip(cpu, gpu))
for c, g in zip(cpu, gpu):
    if c["ids"] == g["ids"]:
        assert c["reward"] == g["reward"], (c, g)
m_cpu = [json.loads(l) for l in open(sys.argv[3]) if '"kind":"train"' in l]
m_gpu = [json.loads(l) for l in open(sys.argv[4]) if '"kind":"train"' in l]
assert len(m_gpu) == 3, len(m_gpu)
first_cpu, first_gpu = m_cpu[0], m_gpu[0]
ratio = "sampling/importance_sampling_ratio/"
print(f"step 1: {same} of 8 completions identical on the device; loss {first_gpu['loss']:.4f} "
      f"(CPU {first_cpu['loss']:.4f}), entropy {first_gpu['entropy']:.3f} "
      f"(CPU {first_cpu['entropy']:.3f}), logp_mismatch {first_gpu['logp_mismatch']:.2e}, "
      f"importance-sampling ratios {first_gpu[ratio + 'min']:.5f} .. {first_gpu[ratio + 'max']:.5f} "
      f"(CPU {first_cpu[ratio + 'min']:.7f} .. {first_cpu[ratio + 'max']:.7f})")
assert same >= 6, same
assert first_gpu["clip_ratio/region_mean"] == 0.0
assert first_gpu["logp_mismatch"] < 0.1, first_gpu["logp_mismatch"]
assert abs(first_gpu["entropy"] - first_cpu["entropy"]) < 0.05 * max(1.0, first_cpu["entropy"])
# TRL's sequence_mask correction: each completion's ratio exp(sum of trainer - generator log
# differences), bf16's differences over at most 12 tokens: near 1, none masked.
for m in m_gpu:
    assert 0.5 < m[ratio + "min"] <= m[ratio + "mean"] <= m[ratio + "max"] < 2.0, m
    assert m["sampling/importance_sampling_masked"] == 0.0, m
if same == 8:
    # dapo: -sum(w_i A_i |y_i|) / sum |y_i|; the device's ratios w differ from 1 by up to
    # max |w - 1|, the CPU's by ~1e-5: that much of sum |A_i| |y_i| / sum |y_i| apart, besides
    # bf16's rounding.
    spread = max(abs(first_gpu[ratio + "min"] - 1.0), abs(first_gpu[ratio + "max"] - 1.0))
    weight = sum(abs(g["advantage"]) * len(g["ids"]) for g in gpu) / sum(len(g["ids"]) for g in gpu)
    allowed = 1e-3 * max(1.0, abs(first_cpu["loss"])) + (spread + 1e-4) * weight
    assert abs(first_gpu["loss"] - first_cpu["loss"]) < allowed, (first_gpu["loss"], first_cpu["loss"], allowed)
assert all(m["grad_norm"] > 0 for m in m_gpu)
PY

# Multi-turn episodes (--environment) on the device: each policy turn's end continues from the
# slot's KV cache after the environment's message is prefilled (GenerationEngine::run_turns). A
# checkpoint with a few more SFT steps ends its turns on <|eot_id|>; the environment answers the
# first turn with a tool result and scores the second. Step 1's episodes follow the CPU's (at
# temperature 0.3: at 0.7 this model's near-ties parted 5 of 8 in bf16, in either turn; bf16 may
# still part one), the environment's tokens are context (the same mask), and the step trains.
"$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --steps 40 --lr 3e-3 \
  --ckpt-dir "$work/ck-turns" --no-progress --backend cpu >"$work/sft.log" 2>&1 ||
  fail "sft for the episodes: $(tail -3 "$work/sft.log")"
cat >"$work/tool.py" <<'PY'
import json, sys
for line in sys.stdin:  # a tool's result after the first turn; a graded reward after the second
    r = json.loads(line)
    if r["turn"] == 1 and not r["final"]:
        answer = {"messages": [{"role": "ipython", "content": "12"}]}
    else:
        answer = {"reward": 1.0 / (1 + len(r["messages"][-1]["content"]))}
    print(json.dumps(answer), flush=True)
PY
turn_args=(grpo --init "$work/ck-turns" --data "$work/prompts" --environment "python3 $work/tool.py"
  --max-turns 2 --steps 1 --seq-len 96 --global-batch 2 --num-generations 4
  --max-completion-length 48 --temperature 0.3 --lr 1e-3 --log-every 0 --no-progress)
for backend in cpu cuda; do
  "$bin" "${turn_args[@]}" --backend "$backend" --ckpt-dir "$work/turns-$backend" \
    --metrics "$work/turns-$backend-metrics.jsonl" --log-completions "$work/turns-$backend.jsonl" \
    >"$work/turns-$backend.log" 2>&1 ||
    fail "grpo --environment on $backend: $(tail -3 "$work/turns-$backend.log")"
done
python3 - "$work/turns-cpu.jsonl" "$work/turns-cuda.jsonl" "$work/turns-cpu-metrics.jsonl" \
  "$work/turns-cuda-metrics.jsonl" <<'PY' || fail "multi-turn episodes on the device"
import json, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
assert len(cpu) == len(gpu) == 8, (len(cpu), len(gpu))
assert sum(e["turns"] == 2 for e in cpu) >= 4, [e["turns"] for e in cpu]  # the cache continued
same = sum(c["ids"] == g["ids"] for c, g in zip(cpu, gpu))
for c, g in zip(cpu, gpu):
    if c["ids"] == g["ids"]:
        assert c["policy"] == g["policy"] and c["reward"] == g["reward"], (c, g)
m_cpu = [json.loads(l) for l in open(sys.argv[3]) if '"kind":"train"' in l][0]
m_gpu = [json.loads(l) for l in open(sys.argv[4]) if '"kind":"train"' in l][0]
print(f"episodes: {same} of 8 identical on the device ({sum(e['turns'] == 2 for e in cpu)} of two "
      f"turns); loss_tokens {m_gpu['loss_tokens']} (CPU {m_cpu['loss_tokens']}), logp_mismatch "
      f"{m_gpu['logp_mismatch']:.2e}, entropy {m_gpu['entropy']:.3f} (CPU {m_cpu['entropy']:.3f})")
assert same >= 6, same
if same == 8:
    assert m_gpu["loss_tokens"] == m_cpu["loss_tokens"]  # the policy's tokens only, on both
assert m_gpu["logp_mismatch"] < 0.1, m_gpu["logp_mismatch"]
assert abs(m_gpu["entropy"] - m_cpu["entropy"]) < 0.05 * max(1.0, m_cpu["entropy"])
PY

if [[ -n $mpiexec ]]; then
  # Two ranks on the device(s): the emulation gives each its own. One step (of a 1-step
  # schedule: the learning rate does not enter step 1's loss).
  split_args=("${grpo_args[@]}")
  for i in "${!split_args[@]}"; do [[ ${split_args[i]} == --steps ]] && split_args[i + 1]=1; done
  L3_EMULATION_DEVICES=2 "$mpiexec" -n 2 "$bin" "${split_args[@]}" --backend cuda \
    --generation-ranks 1 --max-staleness 0 --ckpt-dir "$work/ck-async" \
    --metrics "$work/async-metrics.jsonl" --log-completions "$work/async.jsonl" \
    >"$work/async.log" 2>&1 || fail "asynchronous grpo on the device: $(tail -3 "$work/async.log")"
  python3 - "$work/cuda.jsonl" "$work/async.jsonl" "$work/cuda-metrics.jsonl" \
    "$work/async-metrics.jsonl" <<'PY' || fail "the asynchronous run on the device"
import json, sys
sync = [json.loads(l) for l in open(sys.argv[1])]
split = [json.loads(l) for l in open(sys.argv[2])]
for c in split:
    assert c.pop("policy_version") == c["step"] - 1 and len(c.pop("logprobs")) == len(c["ids"])
# Step 1 from the same weights: every completion the same.
assert len(split) == 8 and [c["ids"] for c in split] == [c["ids"] for c in sync[:8]]
a = [json.loads(l) for l in open(sys.argv[3]) if '"kind":"train"' in l]
b = [json.loads(l) for l in open(sys.argv[4]) if '"kind":"train"' in l]
# The tiny model's 164,160 weights in bf16: 2 bytes each.
assert [s["weights/bytes"] for s in b] == [2 * 164160], [s["weights/bytes"] for s in b]
assert abs(a[0]["loss"] - b[0]["loss"]) < 1e-6, (a[0]["loss"], b[0]["loss"])
assert abs(a[0]["entropy"] - b[0]["entropy"]) < 1e-6 * a[0]["entropy"], (a[0]["entropy"], b[0]["entropy"])
assert abs(a[0]["grad_norm"] - b[0]["grad_norm"]) < 1e-3 * a[0]["grad_norm"]
print("1 generating + 1 training rank, --max-staleness 0: the synchronous run's 8 completions of "
      f"step 1, {b[0]['weights/bytes']:.0f} bytes of bf16 weights; its loss "
      f"{b[0]['loss']:.9f} (synchronous {a[0]['loss']:.9f})")
PY
fi
echo "PASS"
