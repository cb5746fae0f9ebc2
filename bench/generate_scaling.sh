#!/usr/bin/env bash
# The batch generation job's throughput on 2 ranks against 1 rank (goal >= 1.8x), on the mid
# model (bench/mid_model_inputs.cpp's shape, bytes tokenizer, one SFT step from random weights):
# 64 prompts x 2 samples, 32 new tokens each, sampled. Each rank gets THREADS_PER_RANK threads
# (default 1), so that 2 ranks use twice the cores of 1. Both runs must write the same file.
#   bench/generate_scaling.sh [LLAMA3_HPC] [MPIEXEC] [--json FILE]
set -euo pipefail
bin=${1:-build/bin/llama3-hpc}
mpiexec=${2:-mpiexec}
json=""
if [[ ${3:-} == --json ]]; then json=${4:?--json FILE}; fi
threads=${THREADS_PER_RANK:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/mid.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
 "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
 "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
 "tie_word_embeddings": false}
JSON
for i in $(seq 1 16); do
  printf '{"prompt":"Reverse word%d.","completion":"%d drow"}\n' "$i" "$i"
done >"$work/train.jsonl"
"$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train" >/dev/null
"$bin" sft --model "$work/mid.json" --data "$work/train" --seq-len 64 --global-batch 2 --steps 1 \
  --ckpt-dir "$work/ck" --no-progress >/dev/null 2>&1
for i in $(seq 1 64); do
  printf '{"prompt":"Write a short story about the number %d and a lighthouse."}\n' "$i"
done >"$work/prompts.jsonl"

# run RANKS: the job's generation rate (new tokens/s, from its last log line).
run() {
  local ranks=$1
  OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 "$mpiexec" -n "$ranks" "$bin" generate \
    --init "$work/ck" --input "$work/prompts.jsonl" --output "$work/out-$ranks.jsonl" \
    --num-samples 2 --max-new 32 --temperature 0.8 --seed 3 --backend cpu 2>"$work/log-$ranks" >/dev/null
  grep -o '[0-9.]* tokens/s' "$work/log-$ranks" | tail -1 | cut -d' ' -f1
}
one=$(run 1)
two=$(run 2)
cmp -s "$work/out-1.jsonl" "$work/out-2.jsonl" || { echo "error: 1 and 2 ranks wrote different files" >&2; exit 1; }
ratio=$(python3 -c "print(f'{$two / $one:.2f}')")
echo "generate --input on the mid model, $threads thread(s) per rank: 1 rank $one tokens/s, 2 ranks $two tokens/s = ${ratio}x (goal >= 1.8)"
if [[ -n $json ]]; then
  printf '{"benchmark": "generate_scaling", "threads_per_rank": %d, "one_rank_tokens_per_s": %s, "two_ranks_tokens_per_s": %s, "ratio": %s}\n' \
    "$threads" "$one" "$two" "$ratio" >"$json"
fi
