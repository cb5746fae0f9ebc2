#!/usr/bin/env bash
# Training on the GPU through the real program; exits 77 (skipped) without a CUDA device.
#   - 10 SFT steps and 10 reward steps of the tiny model on the CUDA backend follow the CPU
#     backend's loss trajectory within bf16 tolerance, and their evaluations (every 5 steps)
#     match the CPU's;
#   - two runs on the GPU give bit-identical checkpoints; a run killed after its step-5
#     checkpoint and resumed with --resume auto ends bit-identical to the uninterrupted one;
#   - the NCCL exchange on one rank (communicator, stream, events, in-place collectives) changes
#     nothing, bit for bit;
#   - ZeRO-3 (--shard-parameters) on one rank ends bit-identical to ZeRO-2;
#   - with an MPI launcher: two ranks sharing the GPU exchange through host buffers (auto picks
#     it; --grad-exchange nccl is refused with exit 2) and follow the one-rank trajectory, with
#     ZeRO-3 too.
#   training_test.sh PATH/TO/llama3-hpc [MPIEXEC]
# L3_GPU_TEST_BACKEND=cpu runs the same script with the CPU backend in the GPU's place (NCCL
# cases left out): a check of the script itself on a machine without a GPU.
set -uo pipefail
bin=${1:?usage: training_test.sh LLAMA3_HPC [MPIEXEC]}
mpiexec=${2:-}
backend=${L3_GPU_TEST_BACKEND:-cuda}
if [[ $backend == cuda ]] && "$bin" --version | grep -q "^backend cuda: .*devices: none"; then
  echo "SKIP: no CUDA device ($("$bin" --version | grep '^backend cuda:'))"
  exit 77
fi
if [[ $backend == cuda ]] && ! "$bin" --version | grep -q "^backend cuda:"; then
  echo "SKIP: this build has no CUDA backend"
  exit 77
fi
# The CUDA emulation (L3_CUDA=EMULATED, docs/GPU.md) runs kernels on the CPU: minutes per run
# instead of seconds, and no cuDNN engines.
emulated=false
if [[ $backend == cuda ]] && "$bin" --version | grep -q "CUDA emulation"; then emulated=true; fi
run_timeout=${L3_GPU_TEST_RUN_TIMEOUT:-$([[ $emulated == true ]] && echo 1800 || echo 300)}
# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-gpu-train

# The learning rate is the SFT runs' (the reward runs below take their own).
base=(--model tiny --seq-len 128 --global-batch 12 --micro-batch 2 --warmup 2 --steps 10
  --log-every 1 --no-progress)
common=("${base[@]}" --lr 3e-3)
# train NAME [LAUNCHER...] -- ARGS...: output in $work/NAME.log, metrics in $work/NAME.jsonl.
train() {
  local name=$1
  shift
  local launcher=()
  while [[ $1 != -- ]]; do
    launcher+=("$1")
    shift
  done
  shift
  timeout -k 5 "$run_timeout" "${launcher[@]}" "$bin" "$@" --metrics "$work/$name.jsonl" \
    >"$work/$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 && -z ${L3_FAULT:-} ]]; then  # not when a fault was injected to cause it
    echo "  $name exited $rc:"
    tail -5 "$work/$name.log" | sed 's/^/    /'
  fi
  return $rc
}
# close A B TOLERANCE [EARLY]: every step's loss of run B within TOLERANCE of run A's, and the
# first five within EARLY (default: TOLERANCE), relative to max(|loss|, a quarter of A's first
# loss), so that a loss falling towards zero does not turn bf16 noise into a large relative
# difference. Two tiers because bf16 and fp32 runs drift apart as training goes on (the reward
# runs below say by how much, and what the check still catches).
close() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" "${4:-$3}" <<'PY'
import json, math, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if r.get("kind") == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
tol, early_tol = float(sys.argv[3]), float(sys.argv[4])
floor = abs(a[0]) / 4 if a and a[0] is not None else 0.0
diffs = [abs(x - y) / max(abs(x), floor) if x is not None and y is not None else math.inf
         for x, y in zip(a, b)]
worst = max(diffs, default=math.inf)
early = max(diffs[:5], default=math.inf)
ok = (len(a) == len(b) == 10 and all(y is not None and math.isfinite(y) for y in b)
      and worst <= tol and early <= early_tol)
print(f"  losses {a[0]:.4f} -> {a[-1]:.4f} vs {b[0]:.4f} -> {b[-1]:.4f}; worst relative "
      f"difference {worst:.2e} (tolerance {tol:g}), in the first five steps {early:.2e} "
      f"(tolerance {early_tol:g})")
sys.exit(0 if ok else 1)
PY
}
# close_eval A B TOLERANCE: the runs evaluated at the same steps, on the same number of tokens
# (pairs); SFT evaluation losses within TOLERANCE (relative), reward accuracies within TOLERANCE
# (absolute: a pair whose two scores nearly tie may flip between backends).
close_eval() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" <<'PY'
import json, sys
def evals(path):
    return [r for r in map(json.loads, open(path)) if r.get("kind") == "eval"]
a, b, tol = evals(sys.argv[1]), evals(sys.argv[2]), float(sys.argv[3])
same = len(a) == len(b) > 0 and all(
    x["step"] == y["step"] and x.get("tokens") == y.get("tokens") and x.get("pairs") == y.get("pairs")
    for x, y in zip(a, b))
key = "loss" if a and "loss" in a[0] else "accuracy"
def difference(x, y):
    return abs(x - y) / abs(x) if key == "loss" else abs(x - y)
worst = max((difference(x[key], y[key]) for x, y in zip(a, b)), default=1.0)
print(f"  {len(b)} evaluations; {key} {[round(x[key], 4) for x in a]} vs "
      f"{[round(y[key], 4) for y in b]}; worst difference {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if same and worst <= tol else 1)
PY
}
digest() { "$bin" ckpt verify --json "$1" 2>/dev/null; }

# --- the CUDA backend against the CPU reference ---
# With evaluation every 5 steps (on the training shards: what matters is that both backends
# evaluate the same tokens), which must not change training: the bitwise checks below compare
# the "gpu" run with runs that do not evaluate.
sft_eval=(--val-data "$work/sft" --eval-every 5)
train cpu -- sft "${common[@]}" "${sft_eval[@]}" --data "$work/sft" --backend cpu ||
  fail "CPU reference run"
if train gpu -- sft "${common[@]}" "${sft_eval[@]}" --data "$work/sft" --backend "$backend" \
  --ckpt-dir "$work/gpu" --checkpoint-every 5 && close cpu gpu 3e-2 1e-2; then
  pass "SFT on the GPU follows the CPU loss trajectory"
else
  fail "SFT on the GPU follows the CPU loss trajectory"
fi
if close_eval cpu gpu 1e-2; then
  pass "SFT evaluation on the GPU matches the CPU's"
else
  fail "SFT evaluation on the GPU matches the CPU's"
fi
# The reward model at --lr 5e-4 (its loss 0.697 -> 0.345 in 10 steps). At the 3e-3 of the SFT
# runs its gradient norm reaches 4 to 11 (clipped to 1) from step 6 and the trajectory amplifies
# bf16 rounding: on an H200 the CPU and GPU runs parted (0.457 vs 0.361 at step 6) and met again
# at step 10 (0.0650 vs 0.0653), cuDNN's attention parting from both, with step 1 within 5e-5
# (bench/results/gpu-2026-12-04-nvidia-h200.json, "reward_trajectory_investigation"). At 5e-4
# the H200 follows the CPU within 1.3e-2 (fallback attention) and 4e-3 (cuDNN); CPU runs with the
# learning rate 10% off differ by 2.7e-2 within five steps and 1.8e-1 at the end (1% off: 2.3e-2,
# which this check does not catch).
reward_eval=(--val-data "$work/pref" --eval-every 5)
reward_lr=(--lr 5e-4)
train rcpu -- reward "${base[@]}" "${reward_lr[@]}" "${reward_eval[@]}" --data "$work/pref" \
  --backend cpu || fail "CPU reward run"
if train rgpu -- reward "${base[@]}" "${reward_lr[@]}" "${reward_eval[@]}" --data "$work/pref" \
  --backend "$backend" && close rcpu rgpu 3e-2 1e-2; then
  pass "reward on the GPU follows the CPU loss trajectory"
else
  fail "reward on the GPU follows the CPU loss trajectory"
fi
if close_eval rcpu rgpu 5e-2; then
  pass "reward evaluation on the GPU matches the CPU's"
else
  fail "reward evaluation on the GPU matches the CPU's"
fi

# --- cuDNN's fused attention (where it declines a shape the fallback runs; the log says) ---
if [[ $emulated == true ]]; then
  echo "skip [cuDNN attention cases: the CUDA emulation has no cuDNN engines]"
fi
if [[ $backend == cuda && $emulated == false ]]; then
  if train cudnn -- sft "${common[@]}" --data "$work/sft" --backend cuda --attention cudnn &&
    grep -q "calls on cuDNN" "$work/cudnn.log" && ! grep -q "attention: 0 calls on cuDNN" "$work/cudnn.log" &&
    close cpu cudnn 3e-2 1e-2; then
    pass "SFT with cuDNN attention follows the CPU loss trajectory"
  else
    fail "SFT with cuDNN attention follows the CPU loss trajectory"
  fi
  grep "calls on cuDNN" "$work/cudnn.log" | sed 's/^/  /'
  train det1 -- sft "${common[@]}" --data "$work/sft" --backend cuda --attention cudnn \
    --deterministic --ckpt-dir "$work/det1"
  train det2 -- sft "${common[@]}" --data "$work/sft" --backend cuda --attention cudnn \
    --deterministic --ckpt-dir "$work/det2"
  d1=$(digest "$work/det1/step-00000010")
  if [[ -n "$d1" && "$(digest "$work/det2/step-00000010")" == "$d1" ]]; then
    pass "cuDNN attention with --deterministic: two runs bit-identical"
  else
    fail "cuDNN attention with --deterministic: two runs bit-identical"
  fi
fi

# --- the default attention (--attention auto): cuDNN's deterministic backward where the GPU has
# it (the emulation says sm_90, then declines every call to the fallback), so the bitwise checks
# below, with default options, cover it ---
if [[ $backend == cuda ]]; then
  grep "attention (--attention auto)\|calls on cuDNN" "$work/gpu.log" | sed 's/^/  /'
  if grep -q "attention (--attention auto): .*deterministic backward" "$work/gpu.log" &&
    ! { [[ $emulated == false ]] &&
      grep -q "attention (--attention auto): cuDNN" "$work/gpu.log" &&
      grep -q "attention: 0 calls on cuDNN" "$work/gpu.log"; }; then
    pass "the default attention is deterministic and the log says which (on a GPU: cuDNN ran)"
  else
    fail "the default attention is deterministic and the log says which (on a GPU: cuDNN ran)"
  fi
fi
# (on a GPU only: the emulation would run the fallback again, for a minute of CI)
if [[ $backend == cuda && $emulated == false ]]; then
  if train fast -- sft "${common[@]}" --data "$work/sft" --backend cuda \
    --attention cudnn-nondeterministic &&
    grep -q "warn: attention (--attention cudnn-nondeterministic): .*not bit-identical" \
      "$work/fast.log" && ! grep -q "attention: 0 calls on cuDNN" "$work/fast.log"; then
    pass "--attention cudnn-nondeterministic runs on cuDNN and warns that it gives up bit-identical runs"
  else
    fail "--attention cudnn-nondeterministic runs on cuDNN and warns that it gives up bit-identical runs"
  fi
fi

# --- bitwise (default options): repeat, restart, NCCL on one rank ---
ref=$(digest "$work/gpu/step-00000010")
train again -- sft "${common[@]}" --data "$work/sft" --backend "$backend" --ckpt-dir "$work/again" \
  --checkpoint-every 5
if [[ -n "$ref" && "$(digest "$work/again/step-00000010")" == "$ref" ]]; then
  pass "two GPU runs end with bit-identical checkpoints"
else
  fail "two GPU runs end with bit-identical checkpoints"
fi
L3_FAULT="train.update@0#8=kill" train killed -- sft "${common[@]}" --data "$work/sft" \
  --backend "$backend" --ckpt-dir "$work/restart" --checkpoint-every 5
train resumed -- sft "${common[@]}" --data "$work/sft" --backend "$backend" --ckpt-dir "$work/restart" \
  --checkpoint-every 5 --resume auto
if grep -q "resumed at step 5" "$work/resumed.log" &&
  [[ -n "$ref" && "$(digest "$work/restart/step-00000010")" == "$ref" ]]; then
  pass "a GPU run killed at step 8 resumes from step 5 bit for bit"
else
  fail "a GPU run killed at step 8 resumes from step 5 bit for bit"
fi
if [[ $backend == cuda ]]; then
train nccl1 -- sft "${common[@]}" --data "$work/sft" --backend "$backend" --ckpt-dir "$work/nccl1" \
  --grad-exchange nccl
if grep -q "(nccl)" "$work/nccl1.log" && [[ "$(digest "$work/nccl1/step-00000010")" == "$ref" ]]; then
  pass "the NCCL exchange on one rank is bit-identical"
else
  fail "the NCCL exchange on one rank is bit-identical"
fi
fi

# --- ZeRO-3: the weights only as fp32 master pieces, each layer gathered as bf16 ---
# On one rank a gather is this rank's pieces rounded to bf16 into the gather buffer, which must
# round as the update rounds ZeRO-2's bf16 weights: the same checkpoint, bit for bit.
train zero2one -- sft "${common[@]}" --data "$work/sft" --backend "$backend" --shard-gradients \
  --ckpt-dir "$work/zero2one"
train zero3one -- sft "${common[@]}" --data "$work/sft" --backend "$backend" --shard-parameters \
  --ckpt-dir "$work/zero3one"
z2=$(digest "$work/zero2one/step-00000010")
if grep -q "ZeRO-3" "$work/zero3one.log" && [[ -n "$z2" && "$(digest "$work/zero3one/step-00000010")" == "$z2" ]]; then
  pass "ZeRO-3 on one rank is bit-identical to ZeRO-2"
else
  fail "ZeRO-3 on one rank is bit-identical to ZeRO-2"
fi

# --- two ranks on the one GPU ---
if [[ -n "$mpiexec" ]]; then
  if train two "$mpiexec" -n 2 -- sft "${common[@]}" --data "$work/sft" --backend "$backend" &&
    grep -q "$([[ $backend == cuda ]] && echo "(mpi (staged through host memory))" || echo "(mpi)")" \
      "$work/two.log" && close gpu two 2e-2; then
    pass "two ranks sharing the GPU (MPI through host buffers) follow the one-rank run"
  else
    fail "two ranks sharing the GPU (MPI through host buffers) follow the one-rank run"
  fi
  # ZeRO-3 over two ranks sharing the GPU: gathers through host buffers, on the training thread.
  if train zero3two "$mpiexec" -n 2 -- sft "${common[@]}" --data "$work/sft" --backend "$backend" \
    --shard-parameters && close two zero3two 2e-2; then
    pass "ZeRO-3 on two ranks sharing the GPU follows ZeRO-1 on them"
  else
    fail "ZeRO-3 on two ranks sharing the GPU follows ZeRO-1 on them"
  fi
  [[ $backend == cuda ]] && train refused "$mpiexec" -n 2 -- sft "${common[@]}" --data "$work/sft" --backend "$backend" \
    --grad-exchange nccl
  rc=$?
  if [[ $backend != cuda ]]; then
    :
  elif [[ $rc -eq 2 ]] && grep -q "share a GPU" "$work/refused.log"; then
    pass "--grad-exchange nccl with ranks sharing a GPU: exit 2, says why"
  else
    fail "--grad-exchange nccl with ranks sharing a GPU: exit 2, says why (exit $rc)"
  fi
else
  echo "note: no MPI launcher given, the two-rank cases did not run"
fi

finish_checks "GPU training checks"
