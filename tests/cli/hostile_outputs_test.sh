#!/usr/bin/env bash
# Hostile and careless outputs, round 3 (the outputs added with generation and GRPO; docs/CLI.md,
# "What llama3-hpc writes, replaces and removes"), one group of checks per class:
#   kinds:     every file output (generate --output and its .partial and .progress files,
#              --metrics, --log-completions, report --output) is a regular file with one name or
#              nothing yet: a link to a file, a link to a device, a FIFO, a directory, a device
#              (as root), a second hard link are exit 2 with one line, and what was there is
#              left as it was
#   log:       --log-completions appends after what is there (a user's lines, a last line
#              without its newline); refuses a file that is not a completions log; a resumed
#              run drops only its own interrupted suffix, never an earlier run's lines
#   rollouts:  CKPT_DIR/rollouts planted as a link, with a foreign file, a misnamed batch or a
#              directory in it: exit 2 naming it, nothing deleted or written through
#   progress:  a tampered OUTPUT.progress (records beyond the input, negative counts, bytes that
#              cut a line) is exit 2 naming it and never a wrong output; restored, the job ends
#              with the uninterrupted job's file
#   verifier:  --reward-command's whole exchange (a 4 MB request it never reads) is under
#              --reward-timeout; SIGTERM while it scores is exit 75 at once; an answer before the
#              request, two answers to one, another request's id: exit 2 naming the command
#   silent:    --progress bogus beside --no-progress, --tensorboard /, rewards that overflow
#              the group's mean, an "answer" that is null/boolean/object/list: exit 2;
#              --device on the CPU backend: a warning; tokenize --prep agrees with prep
#   globs:     an input path that exists is that file ("p[1].jsonl"), never a pattern
#   memory:    generate refuses a record whose samples' lines it cannot hold (a 40 MB field x 32)
#   paths:     generate --output with a name too long or in a directory it may not write: exit 2
#   prune:     `ckpt prune` right after `ckpt verify` found the newest step damaged keeps K good
#              ones: the damaged one never counts, and is left for you to look at
# (TensorBoard's trim, identified by the run's id in each file's first event, is in
# tests/unit/tensorboard_test.cpp.)
# Everything stays under one scratch directory; the "victim" file, the target of every planted
# link and hard link, must never change.
#   hostile_outputs_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=$(readlink -f "${1:?usage: hostile_outputs_test.sh LLAMA3_HPC MPIEXEC}")
mpiexec=${2:?usage: hostile_outputs_test.sh LLAMA3_HPC MPIEXEC}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3} OMP_NUM_THREADS=1
# shellcheck source=tests/support/cli_checks.sh
source "$here/../support/cli_checks.sh"
: "$mpiexec"  # the runs here are single-rank
cd "$work" || exit 1

echo precious >"$work/victim"
victim_intact() { [[ "$(cat "$work/victim")" == precious ]]; }

# --- a checkpoint, prompts, a metrics file to report on ------------------------------------
for i in $(seq 1 16); do
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "word$i" "$(echo "word$i" | rev)"
done >"$work/train.jsonl"
for i in $(seq 1 8); do
  printf '{"prompt":"Reverse w%s.","answer":"%s"}\n' "$i" "$(echo "w$i" | rev)"
done >"$work/prompts.jsonl"
run "prep sft data" 0 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds"
run "prep prompts" 0 "$bin" prep prompts --input "$work/prompts.jsonl" --tokenizer bytes --output "$work/pr"
sft=(sft --model tiny --data "$work/ds" --seq-len 64 --global-batch 2 --lr 1e-3 --no-progress)
run "a checkpoint and its metrics" 0 "$bin" "${sft[@]}" --steps 2 --ckpt-dir "$work/ck" --metrics "$work/m.jsonl"
gen=("$bin" generate --init "$work/ck" --input "$work/prompts.jsonl" --max-new 8 --seed 3)
# grpo_on DATA: grpo's command line on the prompts DATA; grpo: on $work/pr.
grpo_on=("$bin" grpo --init "$work/ck" --reward-match answer --seq-len 64 --num-generations 2
  --micro-batch 2 --max-completion-length 8 --lr 1e-3 --log-every 0 --no-progress --deterministic)
grpo=("${grpo_on[@]}" --data "$work/pr" --global-batch 2)

# --- kinds: what may be at an output's name ------------------------------------------------
kinds=(link-to-file link-to-device fifo directory hard-link)
if [[ $(id -u) -eq 0 ]]; then kinds+=(device); fi
# plant PATH KIND: puts a thing of KIND at PATH.
plant() {
  rm -rf "$1"
  case $2 in
    link-to-file) ln -s "$work/victim" "$1" ;;
    link-to-device) ln -s /dev/null "$1" ;;
    fifo) mkfifo "$1" ;;
    directory) mkdir "$1" ;;
    hard-link) ln "$work/victim" "$1" ;;
    device) mknod "$1" c 1 3 ;;
  esac
}
# unchanged PATH KIND: the planted thing is still there, as it was.
unchanged() {
  case $2 in
    link-to-file) [[ -L "$1" && "$(readlink "$1")" == "$work/victim" ]] ;;
    link-to-device) [[ -L "$1" && "$(readlink "$1")" == /dev/null ]] ;;
    fifo) [[ -p "$1" && ! -L "$1" ]] ;;
    directory) [[ -d "$1" && ! -L "$1" && -z "$(ls -A "$1")" ]] ;;
    hard-link) [[ -f "$1" && "$(stat -c %h "$1")" == 2 && "$(cat "$1")" == precious ]] ;;
    device) [[ -c "$1" && "$(stat -c %t:%T "$1")" == 1:3 ]] ;;
  esac
}
# refused NAME PATH KIND CMD...: CMD exits 2 with one error line naming PATH; PATH unchanged.
refused() {
  local name=$1 path=$2 kind=$3
  shift 3
  plant "$path" "$kind"
  run "$name onto a $kind" 2 timeout 60 "$@"
  expect "$name onto a $kind: one error line" [ "$(error_lines "$err")" = 1 ]
  expect "$name onto a $kind: names it" contains "$err" "$(basename "$path")"
  expect "$name onto a $kind: left as it was" unchanged "$path" "$kind"
  expect "$name onto a $kind: the victim intact" victim_intact
  rm -rf "$path"
}
for kind in "${kinds[@]}"; do
  refused "generate --output" "$work/g.jsonl" "$kind" "${gen[@]}" --output "$work/g.jsonl"
  expect "generate --output onto a $kind: no temporary file" [ ! -e "$work/g.jsonl.partial" ]
  refused "generate's progress file" "$work/p.jsonl.progress" "$kind" "${gen[@]}" --output "$work/p.jsonl"
  expect "generate's progress file a $kind: no output" [ ! -e "$work/p.jsonl" ]
  refused "generate's temporary file" "$work/t.jsonl.partial" "$kind" "${gen[@]}" --output "$work/t.jsonl"
  refused "--metrics" "$work/mm.jsonl" "$kind" "$bin" "${sft[@]}" --steps 1 --metrics "$work/mm.jsonl"
  refused "report --output" "$work/r.html" "$kind" "$bin" report "$work/m.jsonl" --output "$work/r.html"
  refused "--log-completions" "$work/l.jsonl" "$kind" "${grpo[@]}" --steps 1 --log-completions "$work/l.jsonl"
done

# --- log: --log-completions keeps what is not the run's own --------------------------------
run "grpo, 2 steps, logged" 0 "${grpo[@]}" --steps 2 --ckpt-dir "$work/la" --log-completions "$work/a.jsonl"
expect "8 completions logged (2 steps x 2 prompts x 2)" [ "$(wc -l <"$work/a.jsonl")" = 8 ]
{
  cat "$work/a.jsonl"
  echo '{"step": 99, "note": "a line of mine with a step"}'
  printf 'my last line, without its newline'
} >"$work/b.jsonl"
cp "$work/b.jsonl" "$work/b.before"
run "a fresh run onto a log with a user's lines" 0 "${grpo[@]}" --steps 2 --ckpt-dir "$work/lb" --log-completions "$work/b.jsonl"
expect "what was there is kept, byte for byte" cmp -n "$(stat -c %s "$work/b.before")" "$work/b.before" "$work/b.jsonl"
expect "the last line completed, then the run's lines" \
  [ "$(tail -c +"$(($(stat -c %s "$work/b.before") + 1))" "$work/b.jsonl")" = "$(printf '\n'; cat "$work/a.jsonl")" ]
cp "$work/pr/index.json" "$work/index.before"
run "a dataset's index.json as the log" 2 "${grpo[@]}" --steps 1 --log-completions "$work/pr/index.json"
expect "says it is not a completions log" contains "$err" "not a completions log"
expect "the index is intact" cmp "$work/index.before" "$work/pr/index.json"
echo "my notes" >"$work/notes.txt"
run "a text file as the log" 2 "${grpo[@]}" --steps 1 --log-completions "$work/notes.txt"
expect "the notes intact" [ "$(cat "$work/notes.txt")" = "my notes" ]
# An earlier run's 2 steps, then this run killed in its step 2 and resumed from step 1: only
# this run's step-2 lines go, the earlier run's step 2 stays.
cp "$work/a.jsonl" "$work/c.jsonl"
L3_FAULT="train.update@0#2=kill" run "killed in step 2" 137 "${grpo[@]}" --steps 2 --checkpoint-every 1 \
  --checkpoint-sync --ckpt-dir "$work/lc" --log-completions "$work/c.jsonl"
run "resumed" 0 "${grpo[@]}" --steps 2 --checkpoint-every 1 --ckpt-dir "$work/lc" --log-completions "$work/c.jsonl"
expect "the earlier run's lines, then this run's as if uninterrupted" \
  [ "$(cat "$work/c.jsonl")" = "$(cat "$work/a.jsonl" "$work/a.jsonl")" ]

# --- rollouts: CKPT_DIR/rollouts is the program's own --------------------------------------
mu=("${grpo[@]}" --steps 2 --num-iterations 2)
mkdir -p "$work/elsewhere" && echo mine >"$work/elsewhere/step-00000000.json"
mkdir -p "$work/r1" && ln -s "$work/elsewhere" "$work/r1/rollouts"
run "rollouts planted as a link" 2 "${mu[@]}" --ckpt-dir "$work/r1"
expect "names it" contains "$err" "rollouts: is a symbolic link"
expect "nothing written or deleted through it" [ "$(ls "$work/elsewhere")" = step-00000000.json ]
expect "its target's file intact" [ "$(cat "$work/elsewhere/step-00000000.json")" = mine ]
for planted in notes.txt step-1.json step-abc.json step-000000001.json; do
  mkdir -p "$work/r2/rollouts" && echo mine >"$work/r2/rollouts/$planted"
  run "a foreign $planted in rollouts" 2 "${mu[@]}" --ckpt-dir "$work/r2"
  expect "names $planted" contains "$err" "rollouts/$planted: not a generation batch"
  expect "$planted kept" [ "$(cat "$work/r2/rollouts/$planted")" = mine ]
  rm -rf "$work/r2"
done
mkdir -p "$work/r3/rollouts/step-00000000.json"
run "a directory planted in rollouts" 2 "${mu[@]}" --ckpt-dir "$work/r3"
expect "names it" contains "$err" "step-00000000.json: not a generation batch of llama3-hpc (a directory)"
run "--num-iterations 2 writes its batches" 0 "${mu[@]}" --ckpt-dir "$work/r4"
expect "a batch kept for the last checkpoint's cycle" [ -f "$work/r4/rollouts/step-00000000.json" ]

# --- silent accepts: a value that cannot be meant is said, never ignored -------------------
run "--progress bogus with --no-progress" 2 "$bin" "${sft[@]}" --steps 1 --progress bogus --no-progress
run "--tensorboard /" 2 "$bin" "${sft[@]}" --steps 1 --tensorboard /
expect "says it is the root" contains "$err" "the root directory"
run "--tensorboard //./" 2 "$bin" "${sft[@]}" --steps 1 --tensorboard //./
# An 8 MB option name (a config file's key: the command line holds at most 128 KB per word):
# exit 2 at once, a bounded message, no gigabytes spent on "did you mean".
python3 -c 'import sys; open(sys.argv[1], "w").write("a" * (8 << 20) + " = 1\n")' "$work/huge.ini"
run "an 8 MB option name" 2 python3 "$here/hostile_files.py" maxrss "$bin" "${sft[@]}" --steps 1 --config "$work/huge.ini"
expect "the message is cut" [ "$(wc -c <<<"$err")" -lt 2000 ]
expect "says how long the name is" contains "$err" "(8388608 bytes)"
rss=$(sed -n 's/^maxrss_mib=//p' <<<"$err")
expect "peak memory under 400 MiB (was $rss)" [ "${rss:-99999}" -lt 400 ]
run "--device 99 on the CPU backend" 0 "$bin" "${sft[@]}" --steps 1 --device 99
expect "warns that it is ignored" contains "$out$err" "--device 99 names a CUDA device"
run "--eval-every without --val-data" 0 "$bin" "${sft[@]}" --steps 1 --eval-every 1
expect "warns that nothing is evaluated" contains "$err" "--eval-every 1 without --val-data: nothing is evaluated"

# tokenize --prep agrees with prep: blank lines (a CRLF file's too) skipped, dropped records said.
printf '{"prompt":"a","completion":""}\n   \n\r\n{"prompt":"x","completion":"y"}\n' >"$work/mixed.jsonl"
run "prep of blank lines and an empty completion" 0 "$bin" prep sft --input "$work/mixed.jsonl" --tokenizer bytes --output "$work/mixed"
expect "prep: 2 records, 1 kept" contains "$out" "2 records read, 1 kept"
run "tokenize --prep sft of the same" 0 "$bin" tokenize --tokenizer bytes --prep sft <"$work/mixed.jsonl"
expect "tokenize: 2 lines" [ "$(lines "$out")" = 2 ]
expect "the first says it is dropped" contains "$(head -n 1 <<<"$out")" '{"dropped":'
expect "the second is kept" contains "$(tail -n 1 <<<"$out")" '{"ids":'

# --- globs: a path that exists is that file, never a pattern -------------------------------
head -n 2 "$work/prompts.jsonl" >"$work/p[1].jsonl"
tail -n 3 "$work/prompts.jsonl" >"$work/p1.jsonl"
run "prep --input p[1].jsonl (both files exist)" 0 "$bin" prep prompts --input "$work/p[1].jsonl" --tokenizer bytes --output "$work/glob1"
expect "read p[1].jsonl itself: 2 records" contains "$out" "2 records read, 2 kept"
rm "$work/p1.jsonl"
run "generate --input p[1].jsonl (only it exists)" 0 "$bin" generate --init "$work/ck" \
  --input "$work/p[1].jsonl" --max-new 8 --output "$work/glob.jsonl"
expect "2 lines, one per record of p[1].jsonl" [ "$(wc -l <"$work/glob.jsonl")" = 2 ]
run "a pattern still matches" 0 "$bin" prep prompts --input "$work/p?1?.jsonl" --tokenizer bytes --output "$work/glob2"

# --- memory: generate never holds more output lines than it can --------------------------
python3 -c 'import json, sys; open(sys.argv[1], "w").write(json.dumps({"prompt": "Reverse ab.", "pad": "x" * (40 << 20)}) + "\n")' "$work/fat.jsonl"
run "a 40 MB field, 32 samples" 2 python3 "$here/hostile_files.py" maxrss "$bin" generate --init "$work/ck" \
  --input "$work/fat.jsonl" --max-new 8 --num-samples 32 --output "$work/fat.out.jsonl"
expect "says what it would take" contains "$err" "fat.jsonl:1: its 32 samples would make about"
rss=$(sed -n 's/^maxrss_mib=//p' <<<"$err")
expect "refused in bounded memory (${rss} MiB)" [ "${rss:-99999}" -lt 600 ]
expect "nothing written" [ ! -e "$work/fat.out.jsonl" ]

# --- paths generate cannot write: exit 2, not 1 --------------------------------------------
long_name=$(printf 'n%.0s' $(seq 1 250)).jsonl
run "generate --output with a name too long" 2 "${gen[@]}" --output "$work/$long_name"
expect "says so" contains "$err" "name is too long"
# As user nobody when run as root (root may write anywhere): a copy of the program it may run.
chmod 755 "$work"
cp "$bin" "$work/llama3-hpc" && chmod 755 "$work/llama3-hpc"
mkdir -p "$work/ro" && chmod 555 "$work/ro"
if [[ $(id -u) -eq 0 ]]; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); else as_user=(); fi
run "generate --output in a directory it may not write" 2 "${as_user[@]}" "$work/llama3-hpc" generate \
  --init "$work/ck" --input "$work/prompts.jsonl" --max-new 8 --output "$work/ro/x.jsonl"
expect "says so" contains "$err" "cannot create files in"

# --- progress: a tampered OUTPUT.progress never makes a wrong output ------------------------
job=("${gen[@]}" --batch-size 1)
run "the uninterrupted reference" 0 "${job[@]}" --output "$work/ref.jsonl"
# Rounds of 4 records (batch 1: 4 sequences in flight): stopped as the second round starts.
L3_FAULT="generate.round@0#2=raise:TERM" run "stopped after 4 records" 75 "${job[@]}" --output "$work/s.jsonl"
cp "$work/s.jsonl.progress" "$work/s.progress.saved"
# tamper KEY VALUE: the saved progress with KEY set to VALUE.
tamper() {
  python3 - "$work/s.progress.saved" "$work/s.jsonl.progress" "$1" "$2" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p[sys.argv[3]] = json.loads(sys.argv[4])
open(sys.argv[2], "w").write(json.dumps(p) + "\n")
PY
}
for change in "records 1000000" "records -1" "bytes -5" "completions -3" "tokens -1" "records 2" "bytes 20"; do
  # shellcheck disable=SC2086  # KEY VALUE
  tamper $change
  run "progress with $change" 2 "${job[@]}" --output "$work/s.jsonl"
  expect "$change: names the progress file" contains "$err" "s.jsonl.progress"
  expect "$change: no output" [ ! -e "$work/s.jsonl" ]
done
cp "$work/s.progress.saved" "$work/s.jsonl.progress"
run "the saved progress restored: continued" 0 "${job[@]}" --output "$work/s.jsonl"
expect "the uninterrupted job's file" cmp "$work/ref.jsonl" "$work/s.jsonl"
# Continued by a user who may not write the interrupted run's temporary file (it cannot be cut
# back to what the progress records): exit 2 naming it, not 1; both files kept.
mkdir -p "$work/shared-out" && L3_FAULT="generate.round@0#2=raise:TERM" \
  run "another job stopped" 75 "${job[@]}" --output "$work/shared-out/w.jsonl"
chmod 444 "$work/shared-out/w.jsonl.partial"
[[ $(id -u) -eq 0 ]] && chown 65534:65534 "$work/shared-out"
run "continued, its temporary file not writable" 2 "${as_user[@]}" "$work/llama3-hpc" generate \
  --init "$work/ck" --input "$work/prompts.jsonl" --max-new 8 --seed 3 --batch-size 1 \
  --output "$work/shared-out/w.jsonl"
expect "names the temporary file" contains "$err" "w.jsonl.partial"
expect "both kept" test -f "$work/shared-out/w.jsonl.partial" -a -f "$work/shared-out/w.jsonl.progress"

# --- verifier: the whole exchange under --reward-timeout, stoppable, answers matched --------
# verify NAME CODE SCRIPT [OPTIONS...]: grpo, 1 step, with the verifier SCRIPT (python).
verify() {
  local name=$1 code=$2 script=$3
  shift 3
  printf '%s\n' "$script" >"$work/verifier.py"
  run "$name" "$code" timeout 120 "${grpo[@]}" --steps 1 --reward-command "python3 $work/verifier.py" "$@"
}
answer='import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"reward": 1.0, "id": r["id"]}), flush=True)'
verify "a verifier that echoes each request's id" 0 "$answer"
verify "a verifier that answers before reading" 2 'import sys, time
print("{\"reward\": 1}", flush=True)
time.sleep(1)
for line in sys.stdin:
    print("{\"reward\": 1}", flush=True)'
# Which of the two it sees first depends on when the verifier's early answer arrives: before
# the request is sent (an answer to nothing) or after (two answers to one request).
expect "says so, naming the command" grep -Eq -- '--reward-command .*(before reading this request|more than one answer)' <<<"$err"
verify "a verifier that answers twice" 2 'import sys
for line in sys.stdin:
    print("{\"reward\": 1}", flush=True)
    print("{\"reward\": 0}", flush=True)'
expect "says so" contains "$err" "answer each request once"
verify "a verifier that echoes another id" 2 'import json, sys
for line in sys.stdin:
    print(json.dumps({"reward": 1.0, "id": json.loads(line)["id"] + 1}), flush=True)'
expect "says so" contains "$err" "the answer is to request"
verify "rewards of 1e308 (finite, their mean is not)" 2 'import sys
for line in sys.stdin:
    print("{\"reward\": 1e308}", flush=True)'
expect "says they overflow" contains "$err" "overflow the group's mean"
# An "answer" must be a string or a number: null, a boolean, an object is refused at the start.
for value in null true '{"a": 1}' '[1]'; do
  printf '{"prompt":"Reverse ab.","answer":%s}\n' "$value" >"$work/odd.jsonl"
  rm -rf "$work/odd"
  run "prep prompts with an answer $value" 0 "$bin" prep prompts --input "$work/odd.jsonl" --tokenizer bytes --output "$work/odd"
  run "--reward-match answer, an answer $value" 2 "${grpo_on[@]}" --data "$work/odd" --global-batch 1 --steps 1
  expect "says it is no answer" contains "$err" "has no \"answer\" that is a string or a number"
done
# A request larger than the socket's buffer to a verifier that never reads: the timeout still
# holds (before, send() blocked before the clock started).
python3 - "$work/prompts.jsonl" "$work/big.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        r["pad"] = "x" * (4 << 20)
        out.write(json.dumps(r) + "\n")
PY
run "prep big prompts" 0 "$bin" prep prompts --input "$work/big.jsonl" --tokenizer bytes --output "$work/big"
printf 'import time\ntime.sleep(100)\n' >"$work/deaf.py"
start=$SECONDS
run "a verifier that never reads a 4 MB request" 2 timeout 60 "${grpo_on[@]}" --data "$work/big" --global-batch 2 --steps 1 \
  --reward-command "python3 $work/deaf.py" --reward-timeout 2
expect "within the timeout, not stuck in send()" [ $((SECONDS - start)) -lt 30 ]
expect "says it did not read" contains "$err" "did not read the request within --reward-timeout 2 s"
expect "no verifier left behind" [ -z "$(pgrep -f "$work/deaf.py")" ]
# SIGTERM while waiting for a verifier that never answers: exit 75 at once, not after the timeout.
printf 'import sys, time\nopen(sys.argv[1], "w").close()\ntime.sleep(100)\n' >"$work/mute.py"
"${grpo[@]}" --steps 1 --reward-command "python3 $work/mute.py $work/mute.started" \
  --reward-timeout 60 >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 1 100); do [[ -e "$work/mute.started" ]] && break; sleep 0.1; done
sleep 4  # generated and waiting for the answer
start=$SECONDS
kill -TERM "$pid"
wait "$pid"
code=$?
err=$(cat "$work/err")
expect "SIGTERM while scoring: exit 75 (was $code)" [ "$code" = 75 ]
expect "SIGTERM while scoring: at once" [ $((SECONDS - start)) -lt 10 ]
expect "SIGTERM while scoring: no verifier left behind" [ -z "$(pgrep -f "$work/mute.py")" ]

# --- prune: a damaged checkpoint never counts among the ones kept --------------------------
run "three checkpoints" 0 "$bin" "${sft[@]}" --steps 3 --checkpoint-every 1 --keep-last 5 --checkpoint-sync --ckpt-dir "$work/pk"
model="$work/pk/step-00000003/model.h5"
size=$(stat -c %s "$model")
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$model" bs=1 seek=$((size - 64)) conv=notrunc status=none
run "verify finds the newest damaged" 2 "$bin" ckpt verify "$work/pk"
expect "DAMAGED step 3" contains "$out" "DAMAGED  step-00000003"
run "prune --keep-last 2 right after" 0 "$bin" ckpt prune "$work/pk" --keep-last 2
expect "reports the damaged one" contains "$out" "step-00000003: DAMAGED"
expect "step 2 kept" [ -d "$work/pk/step-00000002" ]
expect "step 1 kept: two good ones in all" [ -d "$work/pk/step-00000001" ]
expect "the damaged one left as it is" [ -d "$work/pk/step-00000003" ]

expect "the victim intact at the end" victim_intact
finish_cli_checks "hostile output checks"
