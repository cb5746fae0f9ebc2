# shellcheck shell=bash
# Sourced by the CLI tests (after they set $work, a scratch directory): run a command and check
# its exit code, then check conditions on its output; one line per check, the failures counted.
failures=0
: "${work:?set work, a scratch directory, before sourcing cli_checks.sh}"

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
# expect NAME TEST-COMMAND...: the command must succeed.
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
lacks() { [[ "$1" != *"$2"* ]]; }
lines() { if [[ -z "$1" ]]; then echo 0; else printf '%s\n' "$1" | wc -l; fi; }
error_lines() { printf '%s\n' "$1" | grep -c '^error: ' || true; }

# finish_cli_checks WHAT: exit 1 with the number of failures, or say that all WHAT passed.
finish_cli_checks() {
  if [[ $failures -gt 0 ]]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all $1 passed"
}
