# shellcheck shell=bash
# Sourced by the shell tests that run the program under mpiexec (after checks.sh, with $bin,
# $mpiexec and $work set):
#   run RANKS ARGS...   the program under mpiexec, output in $work/last.out and last.err, a hang
#                       (120 s) a failed check;
#   digest STEP_DIR     the checkpoint's tensor digests, without the work directory's name;
#   refused NAME RANKS PATTERN ARGS...  a run that must exit 2 with PATTERN in its stderr.
# shellcheck disable=SC2154  # bin, mpiexec and work are the sourcing script's
run() {
  local ranks=$1
  shift
  timeout -k 5 120 "$mpiexec" -n "$ranks" "$bin" "$@" >"$work/last.out" 2>"$work/last.err"
  local rc=$?
  [[ $rc -eq 124 || $rc -eq 137 ]] && fail "a run hung (stopped after 120 s): L3_FAULT='${L3_FAULT:-}' $*"
  return $rc
}
digest() { "$bin" ckpt verify --json "$1" 2>/dev/null | sed "s|$work/[^/\"]*||g"; }
refused() { # NAME RANKS PATTERN ARGS...
  local name=$1 ranks=$2 pattern=$3
  shift 3
  run "$ranks" "$@"
  local rc=$?
  if [[ $rc -eq 2 ]] && grep -q -- "$pattern" "$work/last.err"; then
    pass "$name"
  else
    fail "$name (exit $rc)"
    tail -2 "$work/last.err"
  fi
}
