#!/usr/bin/env bash
# prep throughput with 1 and 2 ranks on a generated SFT JSONL file, next to a raw read of the
# same bytes (cat > /dev/null) in the same run.
#   bench/prep_throughput.sh [BUILD_DIR] [TOKENIZER]      (TOKENIZER: bytes, or Meta's file)
set -euo pipefail
build=${1:-build}
tokenizer=${2:-${L3_LLAMA3_TOKENIZER:-bytes}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/sft.jsonl" <<'PY'
import json, random, sys
random.seed(7)
words = "the of and to in is parallel rank checkpoint gradient tokenizer supercomputer Llama MPI GPU bandwidth".split()
with open(sys.argv[1], "w") as f:
    while f.tell() < 48 << 20:
        q = " ".join(random.choice(words) for _ in range(random.randint(5, 40)))
        a = " ".join(random.choice(words) for _ in range(random.randint(20, 300)))
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
PY
bytes=$(stat -c %s "$work/sft.jsonl")
start=$(date +%s.%N); cat "$work/sft.jsonl" > /dev/null; end=$(date +%s.%N)
raw=$(python3 -c "print($bytes / 1e6 / max($end - $start, 1e-9))")
echo "input: $((bytes >> 20)) MiB of SFT JSONL; tokenizer: $tokenizer"
printf 'raw read (baseline):  %8.1f MB/s\n' "$raw"
for ranks in 1 2; do
  out=$(mpiexec -n $ranks "$build/bin/llama3-hpc" prep sft --input "$work/sft.jsonl" --tokenizer "$tokenizer" \
        --output "$work/ds$ranks" --log-level warn)
  mbs=$(echo "$out" | grep -o '[0-9.]* MB/s' | grep -o '[0-9.]*')
  printf 'prep, %d rank%s:         %8.1f MB/s  = %.3f x raw read\n' "$ranks" "$([ $ranks = 1 ] && echo ' ' || echo s)" "$mbs" \
    "$(python3 -c "print($mbs / $raw)")"
done
