#!/usr/bin/env bash
# Threads per rank on an oversubscribed node: the default choice (src/dist/thread_budget) against
# the other settings a user could pick, in the same run, on the node's own cores:
#   A. more ranks than cores (2 x cores ranks): the default (cores / ranks threads, at least 1,
#      MPI waiting passively) against every rank taking all the cores (what OpenMP does when
#      nothing chooses) and against MPI spinning (L3_WAIT_POLICY=active);
#   B. a busy node (one rank, and one CPU-bound process per core but one): the default (all the
#      cores; the log warns) against OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=passive.
# Each case: 30 SFT steps of the tiny model (seconds, median of 3) and the ratio of the default's
# time to the best setting's (1.0: the default is the best).
#   bench/thread_budget.sh [LLAMA3_HPC] [MPIEXEC] [--json FILE]
set -euo pipefail
bin=${1:-build/bin/llama3-hpc}
mpiexec=${2:-mpiexec}
json=""
if [[ ${3:-} == --json ]]; then json=${4:?--json FILE}; fi
cores=$(nproc)
work=$(mktemp -d)
burners=()
cleanup() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for i in $(seq 1 64); do
  printf '{"prompt":"Reverse word%d.","completion":"%d drow"}\n' "$i" "$i"
done >"$work/train.jsonl"
"$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train" >/dev/null

# seconds RANKS ENV...: the median wall time of 3 runs of 30 steps.
seconds() {
  local ranks=$1
  shift
  local times=()
  for _ in 1 2 3; do
    local start end
    start=$(date +%s.%N)
    env "$@" "$mpiexec" -n "$ranks" "$bin" sft --model tiny --data "$work/train" --seq-len 128 \
      --global-batch $((4 * ranks)) --steps 30 --no-progress --log-every 0 --backend cpu \
      >/dev/null 2>"$work/log"
    end=$(date +%s.%N)
    times+=("$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 2p
}

results=()
report() {  # report CASE NAME SECONDS
  printf '  %-44s %7.2f s\n' "$2" "$3"
  results+=("{\"case\": \"$1\", \"setting\": \"$2\", \"seconds\": $3}")
}
ratio() {  # ratio DEFAULT OTHER...: default / the fastest of all
  printf '%s\n' "$@" | awk 'NR == 1 { d = $1; b = $1 } $1 < b { b = $1 } END { printf "%.2f", d / b }'
}

ranks=$((2 * cores))
echo "A. $ranks ranks on $cores cores"
a_default=$(seconds "$ranks" X=1)
report A "default" "$a_default"
a_all=$(seconds "$ranks" OMP_NUM_THREADS="$cores")
report A "OMP_NUM_THREADS=$cores (every rank all cores)" "$a_all"
a_spin=$(seconds "$ranks" L3_WAIT_POLICY=active)
report A "L3_WAIT_POLICY=active (MPI spins)" "$a_spin"
a_ratio=$(ratio "$a_default" "$a_all" "$a_spin")
echo "  default / best: $a_ratio"

echo "B. 1 rank on $cores cores, $((cores - 1)) busy with another process"
for _ in $(seq 1 $((cores > 1 ? cores - 1 : 1))); do
  (while :; do :; done) &
  burners+=($!)
done
b_default=$(seconds 1 X=1)
report B "default" "$b_default"
grep -o 'the node is busy[^;]*' "$work/log" | head -1 | sed 's/^/  log: /' || true
b_one=$(seconds 1 OMP_NUM_THREADS=1)
report B "OMP_NUM_THREADS=1" "$b_one"
b_passive=$(seconds 1 OMP_WAIT_POLICY=passive)
report B "OMP_WAIT_POLICY=passive" "$b_passive"
b_ratio=$(ratio "$b_default" "$b_one" "$b_passive")
echo "  default / best: $b_ratio"

if [[ -n $json ]]; then
  {
    echo "{\"benchmark\": \"thread_budget\", \"cores\": $cores, \"date\": \"$(date -u +%F)\","
    echo " \"oversubscribed_default_over_best\": $a_ratio, \"busy_default_over_best\": $b_ratio,"
    echo " \"runs\": ["
    (IFS=,; echo "  ${results[*]}")
    echo " ]}"
  } >"$json"
fi
