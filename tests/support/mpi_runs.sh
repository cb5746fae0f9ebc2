# shellcheck shell=bash
# Sourced by the shell tests that run the program under mpiexec (after checks.sh, with $bin,
# $mpiexec and $work set):
#   run RANKS ARGS...   the program under mpiexec, output in $work/last.out and last.err, a hang
#                       (120 s) a failed check;
#   digest STEP_DIR     the checkpoint's tensor digests, without the work directory's name.
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
