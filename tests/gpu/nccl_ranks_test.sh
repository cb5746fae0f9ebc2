#!/usr/bin/env bash
# Data parallel over NCCL: two ranks, each on a GPU of its own, through the real program. Exits 77
# (skipped) with fewer than two CUDA devices; runs on the CUDA emulation with two emulated devices
# (L3_EMULATION_DEVICES=2, set here), whose NCCL moves the data over MPI (tests/emulated/nccl.cpp).
#   - `--grad-exchange auto` picks NCCL; 4 steps in small buckets (several reduce-scatters
#     overlapping the backward, an uneven first bucket, all-gathers after the update) give the
#     same losses and gradient norms and end bit-identical to the same run exchanging through
#     host buffers (--grad-exchange mpi) on the emulation, whose bf16 sum of two ranks rounds once like the host's fp32 sum; within bf16
#     tolerance on GPUs (NCCL's reduction order is its own). Without clipping: the global norm
#     adds its per-piece sums in an order that depends on the bucket layout, which NCCL's
#     preference for even pieces changes.
#   - a rank whose NCCL init fails (rank 1, then rank 0) does not leave the other waiting in its
#     init: both exit at once, the failed rank's error shown;
#   - a run whose rank 1 is killed at step 3 resumes from its step-2 checkpoint and ends
#     bit-identical to the uninterrupted one;
#   - ZeRO-2 (--shard-gradients) over NCCL against ZeRO-2 through host buffers, likewise; close
#     to ZeRO-1; killed at step 3 and resumed, bit for bit;
#   - ZeRO-3 (--shard-parameters) over NCCL against ZeRO-2 over NCCL, bit for bit, its gathers
#     prefetched; killed at step 3 and resumed, bit for bit; eval with sharded weights;
#   - LoRA with its frozen model sharded (--shard-parameters) against it whole, bit for bit;
#   - 2 reward steps over NCCL against the host-buffer exchange, likewise.
#   nccl_ranks_test.sh PATH/TO/llama3-hpc MPIEXEC
set -uo pipefail
bin=${1:?usage: nccl_ranks_test.sh LLAMA3_HPC MPIEXEC}
mpiexec=${2:?usage: nccl_ranks_test.sh LLAMA3_HPC MPIEXEC}
emulated=false
if "$bin" --version | grep -q "CUDA emulation"; then
  emulated=true
  export L3_EMULATION_DEVICES=2
fi
cuda=$("$bin" --version | grep '^backend cuda:')
devices=$(grep -o '[0-9][0-9]*: [^;]*(sm_' <<<"$cuda" | wc -l)
if [[ -z $cuda || $devices -lt 2 ]]; then
  echo "SKIP: two ranks over NCCL need two CUDA devices (${cuda:-no CUDA backend})"
  exit 77
fi
run_timeout=${L3_GPU_TEST_RUN_TIMEOUT:-$([[ $emulated == true ]] && echo 600 || echo 300)}
# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-nccl-ranks

# The tiny model's 0.16M parameters in buckets of 0.05 MiB of fp32 (13107 values): 13 buckets.
# On the emulation SFT takes rows of 64 tokens and 2 micro-batches a rank per step (a step of 3
# micro-batches took 8 s there at 128 tokens, and this test ran 500 s of them; at 64 tokens and
# 3 micro-batches it still took 344 s on a slow 2-core machine); on GPUs rows of 128 and 3
# micro-batches. Reward: rows of 128 on both. The buckets and exchanges are the same.
seq=$([[ $emulated == true ]] && echo 64 || echo 128)
batch=$([[ $emulated == true ]] && echo 8 || echo 12)
common=(--model tiny --seq-len "$seq" --global-batch "$batch" --micro-batch 2 --lr 3e-3 --warmup 2
  --log-every 1 --no-progress --backend cuda --bucket-mb 0.05 --grad-clip 0 --checkpoint-every 2)
# shellcheck disable=SC2034  # used by name (train's second argument)
sft=(sft --data "$work/sft" --steps 4)
# shellcheck disable=SC2034
reward=(reward --data "$work/pref" --steps 2)
# train NAME sft|reward ARGS...: two ranks ($ranks if set); output in $work/NAME.log, metrics in
# $work/NAME.jsonl. A failure is shown unless a fault was injected (L3_FAULT) to cause it.
train() {
  local name=$1
  local -n phase=$2
  shift 2
  timeout -k 5 "$run_timeout" "$mpiexec" -n "${ranks:-2}" "$bin" "${phase[@]}" "${common[@]}" "$@" \
    --ckpt-dir "$work/$name" --metrics "$work/$name.jsonl" >"$work/$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 && -z ${L3_FAULT:-} ]]; then
    echo "  $name exited $rc:"
    tail -5 "$work/$name.log" | sed 's/^/    /'
  fi
  return $rc
}
digest() { "$bin" ckpt verify --json "$1" 2>/dev/null | sed "s|$1||g"; }
losses() {
  python3 - "$1" <<'PY'
import json, sys
print(" ".join(f"{r['loss']:.6f}" for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"))
PY
}
# same_metrics A B STEPS: every step's loss, gradient norm, counts and reward margin equal, to
# the last bit printed.
same_metrics() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" <<'PY'
import json, sys
def steps(path):
    return [(r["step"], r["loss"], r["grad_norm"], r.get("loss_tokens"), r.get("pairs"), r.get("margin"))
            for r in map(json.loads, open(path)) if r.get("kind") == "train"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
for x, y in zip(a, b):
    if x != y:
        print(f"  step {x[0]}: loss {x[1]!r} vs {y[1]!r}, gradient norm {x[2]!r} vs {y[2]!r}")
sys.exit(0 if a == b and len(a) == int(sys.argv[3]) else 1)
PY
}
# close A B TOLERANCE: every step's loss within TOLERANCE (relative).
close() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if r.get("kind") == "train"]
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else 1.0
print(f"  worst relative loss difference {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

# On the emulation, queued work runs at the latest moment CUDA allows (not also at random
# earlier ones): a missing wait between the compute and communication streams then reads stale
# gradients for certain, and shows in the gradient norm.
L3_EMULATION_PROGRESS=latest train nccl sft || fail "two ranks over NCCL ran"
if grep -q "(nccl)" "$work/nccl.log"; then
  pass "two ranks with a GPU each: auto picks NCCL"
else
  fail "two ranks with a GPU each: auto picks NCCL ($(grep -o 'reduction [^)]*)' "$work/nccl.log"))"
fi
echo "  buckets: $(grep -o '[0-9]* gradient buckets' "$work/nccl.log")"
train staged sft --grad-exchange mpi || fail "two ranks through host buffers ran"
ref=$(digest "$work/nccl/step-00000004")
echo "  NCCL losses:   $(losses "$work/nccl.jsonl")"
echo "  staged losses: $(losses "$work/staged.jsonl")"
if [[ $emulated == true ]]; then
  if same_metrics staged nccl 4 && [[ -n $ref && "$(digest "$work/staged/step-00000004")" == "$ref" ]]; then
    pass "NCCL and the host-buffer exchange: same losses and gradient norms, bit-identical checkpoints (emulation)"
  else
    fail "NCCL and the host-buffer exchange: same losses and gradient norms, bit-identical checkpoints (emulation)"
  fi
elif close staged nccl 2e-2; then
  pass "NCCL follows the host-buffer exchange's loss trajectory"
else
  fail "NCCL follows the host-buffer exchange's loss trajectory"
fi

# A rank whose NCCL init fails (a fault injected where it begins; on a GPU: no memory left, a
# broken network setting) never joins NCCL's bootstrap. The others must not wait for it in their
# init until the job's time limit: both ranks exit within a minute, the failed one with its own
# error. Rank 1 fails (rank 0 made the unique id), then rank 0.
for failing in 1 0; do
  started=$SECONDS
  L3_FAULT="nccl.init@$failing=throw-internal" run_timeout=60 train "initfail$failing" sft
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]] &&
    grep -q "injected fault at nccl.init on rank $failing" "$work/initfail$failing.log"; then
    pass "rank $failing's NCCL init fails: both ranks exit ($rc) in $((SECONDS - started)) s, the error named"
  else
    fail "rank $failing's NCCL init fails: both ranks exit (exit $rc after $((SECONDS - started)) s)"
    tail -3 "$work/initfail$failing.log" | sed 's/^/    /'
  fi
done

# Kills: on a GPU at every ZeRO stage; on the emulation (where each run costs about 15 s of CI's
# 2 cores) at ZeRO-3 only, the stage whose restart has the most to put back (the CPU tests kill
# and resume every stage).
if [[ $emulated != true ]]; then
  L3_FAULT="train.update@1#3=kill" train killed sft
  train killed sft --resume auto
  if grep -q "resumed at step 2" "$work/killed.log" &&
    [[ -n $ref && "$(digest "$work/killed/step-00000004")" == "$ref" ]]; then
    pass "two NCCL ranks, rank 1 killed at step 3, resume from step 2 bit for bit"
  else
    fail "two NCCL ranks, rank 1 killed at step 3, resume from step 2 bit for bit"
  fi
fi

# ZeRO-2 over NCCL: each micro-batch's gradient groups reduce-scattered from two slots while the
# backward goes on, the compute stream waiting for a group's reduction (its ticket) only before
# its slot is reused. Bit-identical to ZeRO-2 through host buffers on the emulation; close to
# ZeRO-1 (several micro-batches per step: reduced before they are added up, not after); a run killed
# at step 3 resumes bit for bit.
L3_EMULATION_PROGRESS=latest train zero2 sft --shard-gradients || fail "ZeRO-2 over NCCL ran"
train zero2staged sft --shard-gradients --grad-exchange mpi || fail "ZeRO-2 through host buffers ran"
zero2_ref=$(digest "$work/zero2/step-00000004")
echo "  ZeRO-2 losses: $(losses "$work/zero2.jsonl")"
if [[ $emulated == true ]]; then
  if same_metrics zero2staged zero2 4 &&
    [[ -n $zero2_ref && "$(digest "$work/zero2staged/step-00000004")" == "$zero2_ref" ]]; then
    pass "ZeRO-2 over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
  else
    fail "ZeRO-2 over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
  fi
elif close zero2staged zero2 2e-2; then
  pass "ZeRO-2 over NCCL follows ZeRO-2 through host buffers"
else
  fail "ZeRO-2 over NCCL follows ZeRO-2 through host buffers"
fi
if close nccl zero2 1e-2; then
  pass "ZeRO-2 follows ZeRO-1's loss trajectory"
else
  fail "ZeRO-2 follows ZeRO-1's loss trajectory"
fi
if [[ $emulated != true ]]; then
  L3_FAULT="train.update@1#3=kill" L3_EMULATION_PROGRESS=latest train zero2killed sft --shard-gradients
  L3_EMULATION_PROGRESS=latest train zero2killed sft --shard-gradients --resume auto
  if grep -q "resumed at step 2" "$work/zero2killed.log" &&
    [[ -n $zero2_ref && "$(digest "$work/zero2killed/step-00000004")" == "$zero2_ref" ]]; then
    pass "ZeRO-2 over NCCL, rank 1 killed at step 3, resumes from step 2 bit for bit"
  else
    fail "ZeRO-2 over NCCL, rank 1 killed at step 3, resumes from step 2 bit for bit"
  fi
fi

# ZeRO-3 over NCCL: no rank holds the bf16 weights; each layer group is gathered from the fp32
# master pieces (each rank rounding its own to bf16 on the compute stream) by an all-gather on the
# communication stream, the next group's queued while the current one computes. The same numbers
# as ZeRO-2 over NCCL (the same reduce-scatters, the weights rounded from the same masters): bit
# for bit on the emulation, whose progress `latest` makes a missing wait for a gather read a stale
# slot; every gather but the first of each pass prefetched; killed at step 3, it resumes bit for
# bit; its checkpoint evaluated on two ranks with sharded weights gives the evaluation with whole
# ones.
L3_EMULATION_PROGRESS=latest train zero3 sft --shard-parameters || fail "ZeRO-3 over NCCL ran"
echo "  ZeRO-3 losses: $(losses "$work/zero3.jsonl")"
if [[ $emulated == true ]]; then
  if same_metrics zero2 zero3 4 &&
    [[ -n $zero2_ref && "$(digest "$work/zero3/step-00000004")" == "$zero2_ref" ]]; then
    pass "ZeRO-3 over NCCL and ZeRO-2 over NCCL: same losses and norms, bit-identical (emulation)"
  else
    fail "ZeRO-3 over NCCL and ZeRO-2 over NCCL: same losses and norms, bit-identical (emulation)"
  fi
elif close zero2 zero3 2e-2; then
  pass "ZeRO-3 over NCCL follows ZeRO-2 over NCCL"
else
  fail "ZeRO-3 over NCCL follows ZeRO-2 over NCCL"
fi
prefetched=$(python3 - "$work/zero3.jsonl" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"]
print(f"{sum(r.get('gathers_prefetched', 0) for r in steps)} {sum(r.get('gathers', 0) for r in steps)}")
PY
)
read -r ahead total <<<"$prefetched"
# Only the embedding's gather, the first of each micro-batch's forward pass, has nothing before it
# to hide behind; the tiny model's other groups are queued while the one before computes (10 of
# the 13 gathers of a step of 3 micro-batches on GPUs: groups still in their slot are not
# gathered again).
if [[ $total -gt 0 && $((100 * ahead)) -ge $((60 * total)) ]]; then
  pass "ZeRO-3 over NCCL: $ahead of $total gathers queued while the group before computed"
else
  fail "ZeRO-3 over NCCL: $ahead of $total gathers queued while the group before computed"
fi
L3_FAULT="train.update@1#3=kill" L3_EMULATION_PROGRESS=latest train zero3killed sft --shard-parameters
L3_EMULATION_PROGRESS=latest train zero3killed sft --shard-parameters --resume auto
if grep -q "resumed at step 2" "$work/zero3killed.log" &&
  [[ -n $zero2_ref && "$(digest "$work/zero3killed/step-00000004")" == "$zero2_ref" ]]; then
  pass "ZeRO-3 over NCCL, rank 1 killed at step 3, resumes from step 2 bit for bit"
else
  fail "ZeRO-3 over NCCL, rank 1 killed at step 3, resumes from step 2 bit for bit"
fi
# On 24 of the 120 records (the emulation's fallback attention took 18 s for all of them).
head -n 24 "$work/sft.jsonl" >"$work/eval.jsonl"
"$bin" prep sft --input "$work/eval.jsonl" --tokenizer bytes --output "$work/eval" >/dev/null 2>&1 ||
  fail "the evaluation's data was prepared"
eval_of() {
  timeout -k 5 "$run_timeout" "$mpiexec" -n "$1" "$bin" eval --backend cuda \
    --init "$work/zero3/step-00000004" --data "$work/eval" --seq-len 128 "${@:2}" 2>"$work/eval$1.log"
}
whole=$(eval_of 2)
sharded=$(L3_EMULATION_PROGRESS=latest eval_of 2 --shard-parameters)
echo "  eval on 2 ranks: $whole (whole weights), $sharded (sharded)"
if [[ -n $whole && "$whole" == "$sharded" ]]; then
  pass "eval --shard-parameters over NCCL gives the unsharded evaluation"
else
  fail "eval --shard-parameters over NCCL gives the unsharded evaluation"
fi

# Hybrid sharding over NCCL: 4 ranks as 2 shard groups of 2 (on the emulation: 4 devices), each
# group's reduce-scatter followed on the same stream by the all-reduce across the groups. Against
# the same hybrid run through host buffers, where both happen one after the other on the host:
# the same sums (two terms each, rounded once), so bit for bit on the emulation; an all-reduce
# that ran ahead of its reduce-scatter would add unreduced gradients. 2 steps of 2 micro-batches.
if [[ $emulated == true ]] || [[ $devices -ge 4 ]]; then
  [[ $emulated == true ]] && export L3_EMULATION_DEVICES=4
  pairs_common=("${common[@]}")
  common=(--model tiny --seq-len "$seq" --global-batch 8 --micro-batch 1 --lr 3e-3 --warmup 2
    --log-every 1 --no-progress --backend cuda --bucket-mb 0.05 --grad-clip 0 --checkpoint-every 2
    --shard-parameters --shard-group-size 2)
  # shellcheck disable=SC2034  # used by name (train's second argument)
  hybrid_sft=(sft --data "$work/sft" --steps 2)
  ranks=4 L3_EMULATION_PROGRESS=latest train hybrid hybrid_sft || fail "hybrid ZeRO-3 over NCCL ran"
  ranks=4 train hybridstaged hybrid_sft --grad-exchange mpi || fail "hybrid ZeRO-3 through host buffers ran"
  common=("${pairs_common[@]}")
  if grep -q "shard groups of 2 ranks" "$work/hybrid.log" && grep -q "(nccl)" "$work/hybrid.log"; then
    pass "4 ranks, --shard-group-size 2: hybrid ZeRO-3 over NCCL"
  else
    fail "4 ranks, --shard-group-size 2: hybrid ZeRO-3 over NCCL"
  fi
  if [[ $emulated == true ]]; then
    if same_metrics hybridstaged hybrid 2 &&
      [[ "$(digest "$work/hybrid/step-00000002")" == "$(digest "$work/hybridstaged/step-00000002")" ]]; then
      pass "hybrid ZeRO-3 over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
    else
      fail "hybrid ZeRO-3 over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
    fi
  elif close hybridstaged hybrid 2e-2; then
    pass "hybrid ZeRO-3 over NCCL follows the host-buffer exchange"
  else
    fail "hybrid ZeRO-3 over NCCL follows the host-buffer exchange"
  fi
  [[ $emulated == true ]] && export L3_EMULATION_DEVICES=2
fi

# LoRA over NCCL on the ZeRO-3 run's checkpoint (frozen): with --shard-parameters the frozen
# model is sharded over the ranks and gathered group by group (its own communicator, beside the
# adapters' reduce-scatters); against the frozen model held whole on each rank, ZeRO-2 over the
# adapters in both. The same weights read, the same sums: bit for bit on the emulation.
# shellcheck disable=SC2034  # used by name (train's second argument)
lora_sft=(sft --data "$work/sft" --steps 2 --init "$work/zero3/step-00000004" --lora-rank 4
  --lora-alpha 16 --shard-gradients)
L3_EMULATION_PROGRESS=latest train lora lora_sft || fail "LoRA over NCCL ran"
L3_EMULATION_PROGRESS=latest train lorasharded lora_sft --shard-parameters ||
  fail "LoRA with its frozen model sharded over NCCL ran"
echo "  LoRA losses: $(losses "$work/lora.jsonl") (whole), $(losses "$work/lorasharded.jsonl") (sharded)"
if [[ $emulated == true ]]; then
  if grep -q "the frozen model sharded (1/2 on each rank)" "$work/lorasharded.log" &&
    same_metrics lora lorasharded 2 &&
    [[ "$(digest "$work/lora/step-00000002")" == "$(digest "$work/lorasharded/step-00000002")" ]]; then
    pass "LoRA over NCCL, the frozen model sharded or whole: same losses and norms, bit-identical (emulation)"
  else
    fail "LoRA over NCCL, the frozen model sharded or whole: same losses and norms, bit-identical (emulation)"
  fi
elif close lora lorasharded 2e-2; then
  pass "LoRA over NCCL with its frozen model sharded follows it whole"
else
  fail "LoRA over NCCL with its frozen model sharded follows it whole"
fi

# The reward model (its score head's gradients in the last bucket) over NCCL, two steps of 8
# pairs (2 micro-batches a rank), in rows of 128 tokens (a preference pair's sequences are longer
# than 64).
for i in "${!common[@]}"; do
  case ${common[i]} in
  64) common[i]=128 ;;
  12) common[i]=8 ;;
  esac
done
L3_EMULATION_PROGRESS=latest train rnccl reward || fail "reward over NCCL ran"
train rstaged reward --grad-exchange mpi || fail "reward through host buffers ran"
if [[ $emulated == true ]]; then
  if same_metrics rstaged rnccl 2 &&
    [[ "$(digest "$work/rnccl/step-00000002")" == "$(digest "$work/rstaged/step-00000002")" ]]; then
    pass "reward over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
  else
    fail "reward over NCCL and through host buffers: same losses and norms, bit-identical (emulation)"
  fi
elif close rstaged rnccl 2e-2; then
  pass "reward over NCCL follows the host-buffer exchange's loss trajectory"
else
  fail "reward over NCCL follows the host-buffer exchange's loss trajectory"
fi

finish_checks "NCCL rank checks"
