#!/usr/bin/env bash
# --tensorboard through the real program: a 2-rank SFT run killed after its checkpoint of step 3
# (rank 1 SIGKILLed as step 6 starts, so rank 0 has written steps 4 and 5 already) and resumed;
# before the resume the killed run's event file also loses its last bytes (a record cut short).
# The event files, decoded by Python's protobuf runtime with a CRC-32C of the test's own, hold
# every number of metrics.jsonl's train and eval records exactly once, as float32 scalars at
# their steps, in two files; a later resume after the end appends nothing twice either.
#
#   tensorboard_test.sh LLAMA3_HPC MPIEXEC PROTOC
set -uo pipefail
bin=$1
mpiexec=$2
protoc=$3
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1
# shellcheck source=tests/support/checks.sh
source "$here/../support/checks.sh"

# Python with the protobuf runtime (Debian's python3-protobuf is for /usr/bin/python3).
python=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import google.protobuf' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "SKIP: no Python with the protobuf runtime (apt-get install python3-protobuf)"
  exit 77
fi

# shellcheck source=tests/support/reversal_data.sh
source "$here/../support/reversal_data.sh"
reversal_workdir "$bin" l3-tensorboard
mkdir -p "$work/py"
"$protoc" -I "$here/../../src" --python_out="$work/py" "$here/../../src/train/tensorboard/event.proto" ||
  {
    echo "protoc failed"
    exit 1
  }

args=(sft --model tiny --data "$work/sft" --val-data "$work/sft" --steps 8 --seq-len 128
  --global-batch 8 --lr 3e-3 --eval-every 2 --checkpoint-every 3 --checkpoint-sync
  --ckpt-dir "$work/ckpt" --metrics "$work/metrics.jsonl" --tensorboard "$work/tb"
  --log-every 0 --no-progress)
run() {
  timeout -k 5 120 "$mpiexec" -n 2 "$bin" "${args[@]}" >"$work/last.out" 2>"$work/last.err"
}
check() {  # check NAME FILES
  if "$python" "$here/../support/tensorboard_events.py" check --proto-module "$work/py" \
    --files "$2" "$work/metrics.jsonl" "$work/tb" >"$work/check.out" 2>&1; then
    pass "$1: $(tail -1 "$work/check.out")"
  else
    fail "$1"
    cat "$work/check.out"
  fi
}

L3_FAULT="train.step@1#6=kill" run
rc=$?
killed=$(ls "$work"/tb/events.out.tfevents.* 2>/dev/null)
if [[ $rc -ne 0 && -d "$work/ckpt/step-00000003" && ! -d "$work/ckpt/step-00000006" ]] &&
  grep -q '"step":5,' "$work/metrics.jsonl"; then
  pass "killed at step 6 (rc $rc) after the checkpoint of step 3, steps 4 and 5 reported"
else
  fail "the killed run (rc $rc): $(tail -2 "$work/last.err")"
fi
# The killed file loses its last 5 bytes: its last record (step 5's) is cut short.
if [[ -n "$killed" ]]; then truncate -s -5 "$killed"; fi

run || fail "the resumed run (rc $?): $(tail -2 "$work/last.err")"
if grep -q "dropped .* event(s) after step 3" "$work/last.err"; then
  pass "the resumed run dropped the killed run's events after step 3"
else
  fail "no word of the events dropped after step 3: $(grep tensorboard "$work/last.err")"
fi
check "killed and resumed: every train and eval number once" 2
train_steps=$(grep -c '"kind":"train"' "$work/metrics.jsonl")
if [[ $train_steps -eq 8 ]]; then
  pass "the metrics file has steps 1 to 8 once each"
else
  fail "the metrics file has $train_steps train records"
fi
if grep -q '"kind":"run".*"resumed":true' "$work/metrics.jsonl" &&
  grep -q '"kind":"checkpoint".*"step":3' "$work/metrics.jsonl"; then
  pass "the metrics record the restart and the checkpoints"
else
  fail "the metrics lack the run or checkpoint records"
fi

# Run again after the end: nothing trained, nothing new written twice.
run || fail "the run after the end (rc $?): $(tail -2 "$work/last.err")"
check "resumed after the end: still once each" 3

# A directory that cannot be one: exit 2, one line naming it.
touch "$work/not-a-dir"
args=(sft --model tiny --data "$work/sft" --steps 1 --seq-len 128 --global-batch 8
  --tensorboard "$work/not-a-dir" --log-every 0 --no-progress)
run
rc=$?
if [[ $rc -eq 2 ]] && grep -q "error:.*not-a-dir" "$work/last.err"; then
  pass "--tensorboard naming a file: exit 2, the path named"
else
  fail "--tensorboard naming a file: rc $rc, $(tail -1 "$work/last.err")"
fi

finish_checks "TensorBoard checks"
