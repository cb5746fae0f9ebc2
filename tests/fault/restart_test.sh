#!/usr/bin/env bash
# Fault tests of checkpoint/restart, through the real program under mpiexec:
#   kill -9 a rank mid-step, mid-write, between the data and the rename, before and
#   during the `latest` update (latest.tmp written, not renamed)
#   -> restart with --resume auto until done -> final model.h5 and optim.h5 identical (every
#   tensor's digest) to an uninterrupted run, for SFT and reward;
#   corruption of the newest checkpoint (truncated file, flipped bit, missing manifest, missing
#   file, `latest` at a missing or partial directory, out of space while writing) -> detected,
#   reported, set aside, resumed from the previous one, same final weights;
#   resharding 4 -> 2 and 4 -> 3 ranks -> the same losses within reduction-order tolerance;
#   LoRA: killed and restarted bit for bit (dropout on), 2 -> 1 ranks within tolerance;
#   SIGUSR1 -> exit 75 with a committed checkpoint -> the resumed run ends identically.
#
#   restart_test.sh LLAMA3_HPC MPIEXEC [GROUP]     GROUP: kill, corrupt, reshard, signal (all)
set -uo pipefail
bin=$1
mpiexec=$2
group=${3:-all}
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-fault-XXXXXX")
trap 'umount "$work/small" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
first_rc=0
export OMP_NUM_THREADS=1

fail() {
  echo "FAIL [$1]"
  failures=$((failures + 1))
}
pass() { echo "ok   [$1]"; }

# --- data: a reversal task (SFT) and preference pairs, prepared with the bytes tokenizer ---
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
prep_reversal_data "$bin" "$work" || {
  echo "prep failed"
  exit 1
}

common=(--seq-len 128 --global-batch 12 --micro-batch 2 --lr 3e-3 --warmup 2 --checkpoint-every 6
  --keep-last 3 --log-every 0 --no-progress)
sft_args=(sft --model tiny --data "$work/sft" --steps 24 "${common[@]}")
reward_args=(reward --data "$work/pref" --steps 18 "${common[@]}")

digest() { "$bin" ckpt verify --json "$1" 2>/dev/null; }

# run RANKS ARGS...: the exit code of one run (output to $work/last.out / last.err). A run that
# hangs is a failure in its own right: stopped after 120 s, reported with its output.
run() {
  local ranks=$1
  shift
  timeout -k 5 120 "$mpiexec" -n "$ranks" "$bin" "$@" >"$work/last.out" 2>"$work/last.err"
  local rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "a run hung (stopped after 120 s): L3_FAULT='${L3_FAULT:-}' $*"
    tail -5 "$work/last.err"
  fi
  return $rc
}

# until_done RANKS FAULT ARGS...: one run with L3_FAULT=FAULT, then plain reruns until exit 0.
until_done() {
  local ranks=$1 fault=$2
  shift 2
  L3_FAULT="$fault" run "$ranks" "$@"
  local rc=$? attempts=0
  first_rc=$rc
  while [[ $rc -ne 0 && $attempts -lt 5 ]]; do
    run "$ranks" "$@"
    rc=$?
    attempts=$((attempts + 1))
  done
  return $rc
}

# worst_loss_difference REF.jsonl RESUMED.jsonl N: the largest relative difference between the
# last N losses of REF and the losses of RESUMED (the steps after the resume).
worst_loss_difference() {
  paste <(grep -o '"loss":[^,]*' "$1" | tail -"$3" | cut -d: -f2) \
    <(grep -o '"loss":[^,]*' "$2" | cut -d: -f2) |
    awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d} END {printf "%g", m}'
}

# --- references: uninterrupted runs ---
run 2 "${sft_args[@]}" --ckpt-dir "$work/ref-sft" --metrics "$work/ref-sft.jsonl" || {
  cat "$work/last.err"
  echo "reference SFT run failed"
  exit 1
}
ref_sft=$(digest "$work/ref-sft/step-00000024")
run 2 "${reward_args[@]}" --init "$work/ref-sft" --ckpt-dir "$work/ref-rm" || {
  cat "$work/last.err"
  echo "reference reward run failed"
  exit 1
}
ref_rm=$(digest "$work/ref-rm/step-00000018")
[[ -n "$ref_sft" && -n "$ref_rm" ]] || {
  echo "no reference digests"
  exit 1
}

# --- kill -9 at four places, SFT and reward ---
if [[ $group == all || $group == kill ]]; then
  for fault in "train.update@1#10=kill" "ckpt.write@1#2=kill" "ckpt.before_rename@0#2=kill" \
    "ckpt.before_latest@0#2=kill" "ckpt.latest@0#2=kill"; do
    dir="$work/kill-sft-${fault%%@*}"
    if until_done 2 "$fault" "${sft_args[@]}" --ckpt-dir "$dir" && [[ $first_rc -ne 0 ]] &&
      [[ "$(digest "$dir/step-00000024")" == "$ref_sft" ]]; then
      pass "SFT killed at $fault resumes bit for bit"
    else
      fail "SFT killed at $fault resumes bit for bit"
      tail -3 "$work/last.err"
    fi
    dir="$work/kill-rm-${fault%%@*}"
    if until_done 2 "$fault" "${reward_args[@]}" --init "$work/ref-sft" --ckpt-dir "$dir" &&
      [[ $first_rc -ne 0 ]] && [[ "$(digest "$dir/step-00000018")" == "$ref_rm" ]]; then
      pass "reward killed at $fault resumes bit for bit"
    else
      fail "reward killed at $fault resumes bit for bit"
      tail -3 "$work/last.err"
    fi
  done
fi

# --- corruption of the newest checkpoint ---
if [[ $group == all || $group == corrupt ]]; then
  # A run killed at step 20: checkpoints 6, 12, 18 on disk.
  L3_FAULT="train.update@0#20=kill" run 2 "${sft_args[@]}" --ckpt-dir "$work/template" --checkpoint-sync
  if [[ ! -f "$work/template/step-00000018/manifest.json" ]]; then
    fail "template run left checkpoint 18"
  else
    flip_bit() { # FILE OFFSET-FROM-END
      local file=$1 off
      off=$(($(stat -c %s "$file") - $2))
      local byte
      byte=$(od -An -tu1 -j "$off" -N1 "$file" | tr -d ' ')
      printf '%b' "\\x$(printf %02x $((byte ^ 1)))" | dd of="$file" bs=1 seek="$off" conv=notrunc status=none
    }
    corrupt() { # NAME COMMANDS...: apply to a copy, resume, expect fallback to 12
      local name=$1
      shift
      local dir="$work/corrupt-$name"
      cp -r "$work/template" "$dir"
      # shellcheck disable=SC2294  # the corruptions are shell snippets, run in the copy
      (cd "$dir" && eval "$@")
      run 2 "${sft_args[@]}" --ckpt-dir "$dir"
      local rc=$?
      if [[ $rc -eq 0 && "$(digest "$dir/step-00000024")" == "$ref_sft" ]] &&
        grep -q "resumed at step 12" "$work/last.err"; then
        pass "corruption '$name': detected, resumed from step 12, same result"
      else
        fail "corruption '$name': detected, resumed from step 12, same result (rc $rc)"
        tail -4 "$work/last.err"
      fi
      if [[ $name != latest-* ]]; then
        if [[ -d "$dir/step-00000018.damaged" ]] && grep -q "step-00000018" "$work/last.err"; then
          pass "corruption '$name': set aside as step-00000018.damaged and reported"
        else
          fail "corruption '$name': set aside as step-00000018.damaged and reported"
        fi
      fi
    }
    corrupt truncated 'truncate -s 1000 step-00000018/model.h5'
    corrupt flipped-bit 'flip_bit step-00000018/optim.h5 100'
    corrupt no-manifest 'rm step-00000018/manifest.json'
    corrupt no-optim 'rm step-00000018/optim.h5'
    corrupt latest-missing 'rm -rf step-00000018; echo step-00000099 > latest'
    corrupt latest-partial 'rm -rf step-00000018; mkdir step-00000018.partial; echo junk > step-00000018.partial/model.h5; echo step-00000018.partial > latest'

    # Out of space while writing: a 3 MB file system (one checkpoint fits, the second does
    # not) where mounting is permitted, else a file-size limit set inside the ranks after MPI
    # started (RLIMIT_FSIZE before would kill MPI's shared-memory setup).
    dir="$work/full-disk"
    small="$work/small"
    mkdir -p "$small"
    if mount -t tmpfs -o size=3m tmpfs "$small" 2>/dev/null; then
      where="$small/ckpt"
      fault=""
      failing="step-00000012"
    else
      where="$dir"
      fault="train.step@*#1=fsize:1000000"
      failing="step-00000006"
    fi
    L3_FAULT="$fault" run 2 "${sft_args[@]}" --ckpt-dir "$where"
    rc=$?
    committed=$(cat "$where/latest" 2>/dev/null)
    if [[ $rc -ne 0 && $rc -ne 75 ]] && grep -q "checkpoint $failing" "$work/last.err" &&
      [[ ! -d "$where/$failing" ]] &&
      { [[ -z "$committed" ]] || "$bin" ckpt verify "$where/$committed" >/dev/null 2>&1; }; then
      pass "out of space: the write fails with a clear error, what was committed stays good"
    else
      fail "out of space: the write fails with a clear error, what was committed stays good (rc $rc)"
      tail -3 "$work/last.err"
    fi
    [[ "$where" != "$dir" ]] && cp -r "$where" "$dir" && umount "$small"
    if run 2 "${sft_args[@]}" --ckpt-dir "$dir" && [[ "$(digest "$dir/step-00000024")" == "$ref_sft" ]]; then
      pass "out of space: the rerun with space completes identically"
    else
      fail "out of space: the rerun with space completes identically"
    fi
  fi
fi

# --- resharding: written by 4 ranks, resumed on 2 and on 3 ---
if [[ $group == all || $group == reshard ]]; then
  # One row per micro-batch: 12 rows divide among 4, 3 and 2 ranks.
  reshard_args=(sft --model tiny --data "$work/sft" --steps 24 --seq-len 128 --global-batch 12
    --micro-batch 1 --lr 3e-3 --warmup 2 --checkpoint-every 6 --log-every 0 --no-progress)
  run 4 "${reshard_args[@]}" --ckpt-dir "$work/ref4" --metrics "$work/ref4.jsonl" ||
    fail "the 4-rank reference run"
  for ranks in 2 3; do
    dir="$work/reshard-$ranks"
    L3_FAULT="train.update@0#15=kill" run 4 "${reshard_args[@]}" --ckpt-dir "$dir" --checkpoint-sync
    run "$ranks" "${reshard_args[@]}" --ckpt-dir "$dir" --metrics "$work/reshard-$ranks.jsonl"
    rc=$?
    # Steps 13..24 against the uninterrupted 4-rank run: relative difference below 1e-4.
    worst=$(worst_loss_difference "$work/ref4.jsonl" "$work/reshard-$ranks.jsonl" 12)
    lines=$(grep -c '"kind":"train"' "$work/reshard-$ranks.jsonl" 2>/dev/null || echo 0)
    if [[ $rc -eq 0 && $lines -eq 12 ]] && grep -q "written by 4 ranks" "$work/last.err" &&
      awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}'; then
      pass "4 ranks -> $ranks ranks: same losses (worst relative difference $worst)"
    else
      fail "4 ranks -> $ranks ranks: same losses (rc $rc, $lines steps, worst $worst)"
      tail -3 "$work/last.err"
    fi
  done

  # LoRA adapters on the reference SFT model (frozen). With dropout, rank 1 killed at step 9 and
  # the run restarted: bit for bit (the masks are keyed by step, rank and micro-batch). Without,
  # killed on 2 ranks and resumed on 1: the same losses within reduction-order tolerance (with
  # dropout the masks would follow the new rank layout).
  lora_args=(sft --init "$work/ref-sft/step-00000024" --data "$work/sft" --steps 12 --lora-rank 4
    --lora-alpha 16 "${common[@]}")
  run 2 "${lora_args[@]}" --lora-dropout 0.1 --ckpt-dir "$work/lora-ref" || fail "the LoRA reference run"
  ref_lora=$(digest "$work/lora-ref/step-00000012" | sed "s|$work/lora-ref||g")
  until_done 2 "train.update@1#9=kill" "${lora_args[@]}" --lora-dropout 0.1 --ckpt-dir "$work/lora-killed" \
    --checkpoint-sync
  if [[ $first_rc -ne 0 && -n $ref_lora &&
    "$(digest "$work/lora-killed/step-00000012" | sed "s|$work/lora-killed||g")" == "$ref_lora" ]]; then
    pass "LoRA with dropout: rank 1 killed at step 9, restarted: the adapters bit for bit"
  else
    fail "LoRA with dropout: rank 1 killed at step 9, restarted: the adapters bit for bit (first rc $first_rc)"
  fi
  run 2 "${lora_args[@]}" --ckpt-dir "$work/lora-ref2" --metrics "$work/lora-ref2.jsonl" ||
    fail "the LoRA reference run without dropout"
  L3_FAULT="train.update@0#9=kill" run 2 "${lora_args[@]}" --ckpt-dir "$work/lora-reshard" --checkpoint-sync
  run 1 "${lora_args[@]}" --ckpt-dir "$work/lora-reshard" --metrics "$work/lora-reshard.jsonl"
  rc=$?
  worst=$(worst_loss_difference "$work/lora-ref2.jsonl" "$work/lora-reshard.jsonl" 6)
  lines=$(grep -c '"kind":"train"' "$work/lora-reshard.jsonl" 2>/dev/null || echo 0)
  if [[ $rc -eq 0 && $lines -eq 6 ]] && grep -q "written by 2 ranks" "$work/last.err" &&
    awk -v w="$worst" 'BEGIN {exit !(w < 1e-4)}'; then
    pass "LoRA, 2 ranks -> 1 rank: same losses (worst relative difference $worst)"
  else
    fail "LoRA, 2 ranks -> 1 rank: same losses (rc $rc, $lines steps, worst $worst)"
    tail -3 "$work/last.err"
  fi
fi

# --- SIGUSR1 (and SIGTERM): checkpoint, exit 75, resume to the same result ---
if [[ $group == all || $group == signal ]]; then
  for sig in USR1 TERM; do
    dir="$work/signal-$sig"
    L3_FAULT="train.step@1#9=raise:$sig" run 2 "${sft_args[@]}" --ckpt-dir "$dir"
    rc=$?
    if [[ $rc -eq 75 && "$(cat "$dir/latest" 2>/dev/null)" == "step-00000009" ]] &&
      grep -q "exit 75" "$work/last.out"; then
      pass "SIG$sig: exit 75 with checkpoint step-00000009"
    else
      fail "SIG$sig: exit 75 with checkpoint step-00000009 (rc $rc, latest $(cat "$dir/latest" 2>/dev/null))"
      tail -3 "$work/last.err"
    fi
    if run 2 "${sft_args[@]}" --ckpt-dir "$dir" && [[ "$(digest "$dir/step-00000024")" == "$ref_sft" ]]; then
      pass "SIG$sig: the resumed run ends bit for bit as the uninterrupted one"
    else
      fail "SIG$sig: the resumed run ends bit for bit as the uninterrupted one"
    fi
  done
  # The deadline: a long run told it must end in 2 s stops by itself with a checkpoint.
  dir="$work/deadline"
  run 2 sft --model tiny --data "$work/sft" --steps 100000 "${common[@]}" --ckpt-dir "$dir" \
    --deadline 2 --deadline-margin 0
  rc=$?
  if [[ $rc -eq 75 && -f "$dir/latest" ]] && grep -q "deadline" "$work/last.err"; then
    pass "--deadline: checkpointed and exited 75 before it"
  else
    fail "--deadline: checkpointed and exited 75 before it (rc $rc)"
    tail -3 "$work/last.err"
  fi
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all restart checks passed"
