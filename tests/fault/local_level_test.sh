#!/usr/bin/env bash
# Fault tests of the node-local checkpoint level (--ckpt-local), through the real program under
# mpiexec, with 4 ranks pretending to be on several nodes (L3_PRETEND_NODES):
#   partner, 4 ranks as 2 nodes: rank 1 killed right after the node-local checkpoint of step 15
#   (the last flush to --ckpt-dir: step 12), one node's directory deleted -> the rerun resumes
#   from the node-local step 15 (the lost states from their partner copies) and ends bit for
#   bit as the uninterrupted run; both nodes' directories deleted -> it falls back to the
#   flushed step 12 and still ends bit for bit;
#   xor, 4 ranks as 4 nodes: the same with one node lost (rebuilt from parity) and with two
#   nodes of the set lost (fallback to step 12);
#   a truncated state file and a bit-flipped copy -> reported as damaged, the next level used,
#   bit for bit at the end; a restart with the ranks on other nodes: the states are sent to them;
#   --resume none where the node-local level has steps -> exit 2.
#
#   local_level_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-local-level
failures=0
export OMP_NUM_THREADS=1

fail() {
  echo "FAIL [$1]"
  failures=$((failures + 1))
}
pass() { echo "ok   [$1]"; }

args=(sft --model tiny --data "$work/sft" --steps 24 --seq-len 128 --global-batch 12 --micro-batch 1
  --lr 3e-3 --warmup 2 --log-every 0 --no-progress)
digest() { "$bin" ckpt verify --json "$1" 2>/dev/null; }

# run NODES ARGS...: one 4-rank run pretending to be on NODES nodes (output in $work/last.*).
run() {
  local nodes=$1
  shift
  L3_PRETEND_NODES=$nodes timeout -k 5 120 "$mpiexec" -n 4 "$bin" "$@" >"$work/last.out" \
    2>"$work/last.err"
}

run 1 "${args[@]}" --ckpt-dir "$work/ref" || {
  cat "$work/last.err"
  echo "reference run failed"
  exit 1
}
ref=$(digest "$work/ref/step-00000024")

# scenario NAME NODES[:RESTART_NODES] REDUNDANCY EXPECTED DAMAGE...: a run killed after the node-local
# checkpoint of step 15, the DAMAGE command run in its node-local directory, then resumed: it
# must resume from EXPECTED (local-15, local-12: the node-local level at that step; flushed-12:
# --ckpt-dir's step 12) and end as the reference.
scenario() {
  local name=$1 nodes=${2%:*} renodes=${2#*:} redundancy=$3 expect=$4
  shift 4
  local dir="$work/$name"
  local level=(--ckpt-dir "$dir/ckpt" --ckpt-local "$dir/local/%h" --checkpoint-every-local 3
    --flush-every 4 --ckpt-redundancy "$redundancy")
  L3_FAULT="ckpt.local.complete@1#5=kill" run "$nodes" "${args[@]}" "${level[@]}"
  local rc=$?
  if [[ $rc -eq 0 || ! -d "$dir/ckpt/step-00000012" || -d "$dir/ckpt/step-00000015" ]]; then
    fail "$name: the run was killed after step 15, with step 12 flushed (rc $rc)"
    return
  fi
  (cd "$dir/local" && "$@") || {
    fail "$name: damaging the node-local level"
    return
  }
  run "$renodes" "${args[@]}" "${level[@]}"
  rc=$?
  cp "$work/last.err" "$work/$name.log"
  if [[ $rc -ne 0 ]]; then
    fail "$name: the resumed run succeeds (rc $rc)"
    tail -3 "$work/last.err"
    return
  fi
  local said="resuming from the node-local level at step ${expect#local-} "
  [[ $expect == flushed-12 ]] && said="resuming from $dir/ckpt/step-00000012"
  if ! grep -q "$said" "$work/last.err"; then
    fail "$name: resumed from $expect"
    grep -i "resum\|damaged\|cannot" "$work/last.err" | head -5
    return
  fi
  if [[ "$(digest "$dir/ckpt/step-00000024")" == "$ref" ]]; then
    pass "$name: resumed from $expect, ends bit for bit as the uninterrupted run"
  else
    fail "$name: ends bit for bit as the uninterrupted run"
  fi
}

# The pretended nodes' names end in -node0, -node1, ...
lose() { for n in "$@"; do rm -rf ./*-node"$n"; done; }
truncate_state() { truncate -s -100 ./*-node0/*/step-00000015/rank-00000.state; }
flip_copy() {
  local f off byte
  f=$(echo ./*-node1/*/step-00000015/rank-00000.copy)
  off=$(($(stat -c %s "$f") - 50))
  byte=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
  printf '%b' "\\x$(printf %02x $((byte ^ 1)))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
}

scenario partner-one-node-lost 2 partner local-15 lose 1
scenario partner-both-halves-lost 2 partner flushed-12 lose 0 1
scenario xor-one-node-lost 4 xor local-15 lose 2
scenario xor-two-nodes-of-a-set-lost 4 xor flushed-12 lose 1 3
# The restart places the ranks on other nodes (4 instead of 2): the states on node 1 are read
# there and sent to their ranks, now on nodes 2 and 3.
scenario ranks-on-other-nodes 2:4 partner local-15 true
if grep -Eq "from (its file|their files) on (another node|other nodes)" "$work/ranks-on-other-nodes.log" 2>/dev/null; then
  pass "ranks-on-other-nodes: states sent to ranks on other nodes"
else
  fail "ranks-on-other-nodes: states sent to ranks on other nodes"
fi
scenario truncated-state 2 partner local-15 truncate_state
if grep -q "damaged, not used: .*rank-00000.state" "$work/truncated-state.log" 2>/dev/null; then
  pass "truncated-state: the truncated file is reported and its partner copy used"
else
  fail "truncated-state: the truncated file is reported and its partner copy used"
fi
# Both the state and its copy damaged: rank 0 of step 15 is on no node; the node-local step 12
# (as new as --ckpt-dir's) is used.
scenario truncated-state-and-flipped-copy 2 partner local-12 eval 'truncate_state && flip_copy'
if grep -q "damaged, not used: .*rank-00000.copy" "$work/truncated-state-and-flipped-copy.log" 2>/dev/null; then
  pass "truncated-state-and-flipped-copy: the flipped copy is reported"
else
  fail "truncated-state-and-flipped-copy: the flipped copy is reported"
fi

# --resume none into a run whose node-local level has steps: refused.
L3_FAULT="ckpt.local.complete@1#1=kill" run 2 "${args[@]}" --ckpt-dir "$work/fresh" \
  --ckpt-local "$work/fresh-local/%h" --checkpoint-every-local 3
run 2 "${args[@]}" --ckpt-dir "$work/fresh" --ckpt-local "$work/fresh-local/%h" \
  --checkpoint-every-local 3 --resume none
rc=$?
if [[ $rc -eq 2 ]] && grep -q "node-local level" "$work/last.err"; then
  pass "--resume none with node-local checkpoints of an earlier run: exit 2"
else
  fail "--resume none with node-local checkpoints of an earlier run: exit 2 (rc $rc)"
  tail -2 "$work/last.err"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all node-local level checks passed"
