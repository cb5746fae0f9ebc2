#!/usr/bin/env bash
# The program's contract at its edge: help, version, exit codes (0 ok, 2 usage/bad input,
# 1 internal, 75 checkpointed) and one-line errors printed once, alone and under mpiexec.
#   cli_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=${1:?usage: cli_test.sh LLAMA3_HPC MPIEXEC}
mpiexec=${2:?usage: cli_test.sh LLAMA3_HPC MPIEXEC}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
failures=0

# run NAME EXPECTED_CODE CMD...: runs CMD, captures stdout/stderr in $out/$err, checks the code.
run() {
  local name=$1 expected=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  code=$?
  out=$(cat "$work/out")
  err=$(cat "$work/err")
  if [[ "$code" != "$expected" ]]; then
    echo "FAIL [$name]: exit code $code, expected $expected"
    echo "  stdout: ${out:0:2000}"
    echo "  stderr: ${err:0:2000}"
    failures=$((failures + 1))
    return 1
  fi
  echo "ok   [$name] (exit $code)"
}
# expect NAME CONDITION-DESCRIPTION TEST-COMMAND...
expect() {
  local name=$1
  shift
  if ! "$@"; then
    echo "FAIL [$name]: $*"
    echo "  stdout: ${out:0:2000}"
    echo "  stderr: ${err:0:2000}"
    failures=$((failures + 1))
  fi
}
contains() { [[ "$1" == *"$2"* ]]; }
lines() { [[ -z "$1" ]] && echo 0 || printf '%s\n' "$1" | wc -l; }
error_lines() { printf '%s\n' "$1" | grep -c '^error: ' || true; }

# --- help and version: no MPI needed ---
run "top-level help" 0 "$bin" --help
for cmd in prep sft reward eval generate score export tokenize ckpt demo info; do
  expect "help lists $cmd" contains "$out" "  $cmd "
done
run "no arguments is a usage error" 2 "$bin"
expect "usage goes to stderr" contains "$err" "Usage: llama3-hpc"
run "version" 0 "$bin" --version
expect "version names the program" contains "$out" "llama3-hpc 0."
expect "version lists MPI" contains "$out" "MPI: "
expect "version lists HDF5" contains "$out" "HDF5: "
expect "version lists the cpu backend" contains "$out" "backend cpu:"
run "subcommand help" 0 "$bin" info --help
expect "subcommand help shows its options" contains "$out" "--json"
expect "subcommand help shows common options" contains "$out" "--config"
run "help of a command not built yet" 0 "$bin" sft --help
expect "it says so" contains "$out" "not built yet"

# --- usage errors: one line, exit 2 ---
run "unknown command" 2 "$bin" train
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names the command" contains "$err" "'train'"
run "unknown top-level option" 2 "$bin" --frobnicate
run "a command not built yet refuses to pretend" 2 "$bin" sft --data x
expect "it says which command" contains "$err" "'llama3-hpc sft' is not built yet"

# --- tokenize: a stream filter ---
printf '{"text":"Hi"}\n\n{"text":"<|eot_id|>"}\n' >"$work/text.jsonl"
run "tokenize with the bytes tokenizer" 0 "$bin" tokenize --tokenizer bytes --bos --eos <"$work/text.jsonl"
expect "ids with BOS and EOS" contains "$out" '{"ids":[256,72,105,257]}'
expect "special text stays text" contains "$out" '{"ids":[256,60,124,101,111,116,95,105,100,124,62,257]}'
printf '{"text":"ok"}\n{"txt":1}\n' >"$work/bad.jsonl"
run "tokenize names the bad line" 2 "$bin" tokenize --tokenizer bytes <"$work/bad.jsonl"
expect "stdin:2" contains "$err" 'error: stdin:2: expected an object with a string "text"'
run "tokenize needs --tokenizer" 2 "$bin" tokenize <"$work/text.jsonl"

# --- prep ---
printf '%s\n' '{"prompt":"Q1","completion":"A1"}' '{"text":"hello"}' '{"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a"}]}' >"$work/sft.jsonl"
run "prep sft" 0 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds"
expect "summary" contains "$out" "prep sft: 3 records read, 3 kept"
expect "index.json" [ -f "$work/ds/index.json" ]
run "prep refuses to overwrite" 2 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds"
expect "says why" contains "$err" "exists"
run "prep --overwrite" 0 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds" --overwrite
gzip -c "$work/sft.jsonl" >"$work/sft-gz.jsonl.gz"
run "prep reads .jsonl.gz" 0 "$bin" prep sft --input "$work/sft-gz.jsonl.gz" --tokenizer bytes --output "$work/ds-gz"
expect "3 kept from gzip" contains "$out" "3 records read, 3 kept"
printf '%s\n' '{"prompt":"Q","chosen":"good","rejected":"bad"}' >"$work/pref.jsonl"
run "prep preference on 2 ranks" 0 "$mpiexec" -n 2 "$bin" prep preference --input "$work/pref.jsonl" --tokenizer bytes --output "$work/pref"
expect "one pair" contains "$out" "1 kept"
printf '%s\n' '{"text":"ok"}' '{"text": 5}' >"$work/bad-record.jsonl"
run "a bad record: file:line, exit 2" 2 "$mpiexec" -n 2 "$bin" prep sft --input "$work/bad-record.jsonl" --tokenizer bytes --output "$work/never"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names file and line" contains "$err" "bad-record.jsonl:2: \"text\" must be a string"
expect "nothing written" [ ! -e "$work/never" ]
run "prep without a kind" 2 "$bin" prep --input "$work/sft.jsonl" --tokenizer bytes --output "$work/x"
run "prep with a missing input" 2 "$bin" prep sft --input "$work/none-*.jsonl" --tokenizer bytes --output "$work/x"
expect "names the pattern" contains "$err" "none-*.jsonl: no input file matches"

# --- single process (MPI singleton) ---
run "info runs" 0 "$bin" info
expect "info reports the world" contains "$out" "world:     1 rank on 1 node"
expect "info self-check passes" contains "$out" "allreduce over 1 ranks: ok"
run "info --json" 0 "$bin" info --json
expect "json has world_size" contains "$out" '"world_size":1'
run "bad option" 2 "$bin" info --bogus
expect "one line for a bad option" [ "$(lines "$err")" = 1 ]
expect "names the option" contains "$err" "bogus"
run "bad log level" 2 "$bin" info --log-level loud
expect "names the level" contains "$err" "loud"

printf 'json = true\n# comment\n' >"$work/good.ini"
run "options from a config file" 0 "$bin" info --config "$work/good.ini"
expect "config json=true took effect" contains "$out" '"world_size":1'
printf 'json = true\nnot-an-option = 3\n' >"$work/bad.ini"
run "unknown key in a config file" 2 "$bin" info --config "$work/bad.ini"
expect "names the file" contains "$err" "error: $work/bad.ini: "
expect "names the key" contains "$err" "not-an-option"
run "missing config file" 2 "$bin" info --config "$work/missing.ini"
expect "names the missing file" contains "$err" "$work/missing.ini: cannot read config file"

# --- under mpiexec: printed once by rank 0, same exit code from the launcher ---
run "info on 2 ranks" 0 "$mpiexec" -n 2 "$bin" info
expect "2 ranks" contains "$out" "world:     2 ranks on 1 node"
expect "printed once" [ "$(printf '%s\n' "$out" | grep -c '^world:')" = 1 ]
run "demo on 2 ranks" 0 "$mpiexec" -n 2 "$bin" demo
run "bad option on 2 ranks" 2 "$mpiexec" -n 2 "$bin" info --bogus
expect "exactly one line on stderr" [ "$(lines "$err")" = 1 ]
run "help under mpiexec prints once" 0 "$mpiexec" -n 2 "$bin" --help
expect "one help text" [ "$(printf '%s\n' "$out" | grep -c '^Usage: llama3-hpc <command>')" = 1 ]
run "not built under mpiexec prints once" 2 "$mpiexec" -n 2 "$bin" reward
expect "one error line" [ "$(error_lines "$err")" = 1 ]

# One rank fails after the command's collectives, the others finish: the job exits 2 and
# rank 0 names the failing rank.
L3_FAULT="cli.finished@1=throw-input" run "one rank fails with bad input" 2 "$mpiexec" -n 2 "$bin" info
expect "rank 0 names rank 1" contains "$err" "error: [rank 1] injected fault at cli.finished on rank 1"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
L3_FAULT="cli.run@*=throw-internal" run "every rank fails alike" 1 "$mpiexec" -n 2 "$bin" info
expect "two distinct messages (they name their rank)" [ "$(error_lines "$err")" = 2 ]

# One rank fails while another is stuck: after the grace period the failing rank aborts the
# job with its code instead of leaving it hanging.
L3_ERROR_GRACE_SECONDS=1 L3_FAULT="cli.run@0=sleep:30,cli.run@1=throw-input" \
  run "a failure while a peer is busy aborts the job" 2 "$mpiexec" -n 2 "$bin" info
expect "the failing rank explains" contains "$err" "error: [rank 1/2] injected fault at cli.run on rank 1"
expect "and says why it aborts" contains "$err" "aborting the job"

L3_FAULT="cli.run@1=exit:75" run "a rank's exit code reaches the launcher" 75 "$mpiexec" -n 2 "$bin" info

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
