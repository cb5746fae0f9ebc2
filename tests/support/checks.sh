# shellcheck shell=bash
# Sourced by the shell tests: one line per check ("ok   [what]" or "FAIL [what]"), and the end.
failures=0
fail() {
  echo "FAIL [$1]"
  failures=$((failures + 1))
}
pass() { echo "ok   [$1]"; }
# check NAME COMMAND...: pass when the command succeeds.
check() {
  local name=$1
  shift
  if "$@"; then pass "$name"; else fail "$name"; fi
}
# finish_checks WHAT: exit 1 with the number of failures, or say that all WHAT passed.
finish_checks() {
  if [[ $failures -ne 0 ]]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "all $1 passed"
}
