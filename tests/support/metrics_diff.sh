# shellcheck shell=bash
# Sourced by the shell tests that compare two runs' metrics files (after checks.sh):
#   differences REF.jsonl RUN.jsonl [apart]  the largest relative difference of the steps' losses
#       and gradient norms and of the evaluations' figures ("inf" when a file yields none); with
#       "apart", the steps' and the evaluations' separately ("S E");
#   within D T                               D is a number below T ("inf" or nothing is not).
differences() {
  python3 - "$@" <<'PY'
import json, sys
def values(path):
    steps, evals = [], []
    for line in open(path):
        r = json.loads(line)
        if "grad_norm" in r:
            steps += [r["loss"], r["grad_norm"]]
        elif r.get("kind") == "eval":
            evals += [r[k] for k in ("loss", "tokens", "pairs", "accuracy", "margin",
                                     "reward_mean", "reward_std") if k in r]
    return steps, evals
def relative(x, y):
    return 0.0 if x == y else abs(x - y) / max(abs(x), abs(y))
apart = len(sys.argv) > 3
try:
    (a, ea), (b, eb) = values(sys.argv[1]), values(sys.argv[2])
    ok = len(a) == len(b) and a and len(ea) == len(eb) and ea
    worst = lambda u, v: max(relative(x, y) for x, y in zip(u, v))
    if not ok:
        print("inf inf" if apart else "inf")
    else:
        print(f"{worst(a, b)} {worst(ea, eb)}" if apart else worst(a + ea, b + eb))
except Exception:  # a missing or unreadable file: no figure
    print("inf inf" if apart else "inf")
PY
}
within() { [[ $1 =~ ^[0-9.e+-]+$ ]] && awk -v d="$1" -v t="$2" 'BEGIN {exit !(d + 0 < t + 0)}'; }
