#!/usr/bin/env bash
# Tensor parallelism (--tensor-parallel T) through the real program under mpiexec, on the
# reversal task with a small model whose 8 heads, 4 key/value heads, 192 MLP columns and 512
# vocabulary ids split 2 and 4 ways:
#   TP 2 and 4, TP 2 x CP 2, TP 2 x data parallel 2 with ZeRO-2 and ZeRO-3, TP 2 with
#   --recompute and with tied embeddings: the 1-rank run's losses, gradient norms and
#   evaluation within 1e-5 over 5 steps;
#   DPO (full fine-tuning) under TP 2: the 1-rank run's within 1e-5; a reward model under TP 2:
#   its losses and gradient norms within 1e-5, its evaluation within 1e-4;
#   killed (SIGKILL) after a checkpoint and resumed on the same layout: bit for bit; its
#   checkpoint is the whole model's (the 1-rank run resumes it) and resumes on TP 4 and
#   TP 2 x CP 2 within reduction-order tolerance; a 1-rank checkpoint resumes on TP 2; its
#   row-parallel weights are one block slice per rank in the manifest;
#   what it refuses: a model whose heads do not divide, LoRA, grpo.
#
#   tensor_parallel_test.sh LLAMA3_HPC MPIEXEC
set -uo pipefail
bin=$1
mpiexec=$2
export OMP_NUM_THREADS=1

# shellcheck source=tests/support/checks.sh
source "$(dirname "$0")/../support/checks.sh"
# shellcheck source=tests/support/mpi_runs.sh
source "$(dirname "$0")/../support/mpi_runs.sh"
# shellcheck source=tests/support/metrics_diff.sh
source "$(dirname "$0")/../support/metrics_diff.sh"
# shellcheck source=tests/support/reversal_data.sh
source "$(dirname "$0")/../support/reversal_data.sh"
reversal_workdir "$bin" l3-tensor

# The model: tiny's shape with heads that 4 ranks divide; and the same with tied embeddings.
model_config() { # FILE TIED
  cat >"$1" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
 "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "tie_word_embeddings": $2}
JSON
}
model_config "$work/tp.json" false
model_config "$work/tp-tied.json" true

common=(sft --model "$work/tp.json" --data "$work/sft" --val-data "$work/sft" --seq-len 128
  --global-batch 4 --micro-batch 2 --lr 3e-3 --warmup 2 --steps 5 --eval-every 5 --log-every 0
  --no-progress)

# compare NAME REF.jsonl RANKS ARGS...: a run against REF within 1e-5
compare() {
  local name=$1 ref=$2 ranks=$3
  shift 3
  local metrics="$work/run-$((++runs)).jsonl"
  if run "$ranks" "$@" --metrics "$metrics"; then
    local worst
    worst=$(differences "$ref" "$metrics")
    check "$name: the 1-rank run's losses, gradient norms and evaluation within 1e-5 ($worst)" \
      within "$worst" 1e-5
  else
    fail "$name ran"
    tail -3 "$work/last.err"
  fi
}
runs=0

# --- the same training on 1 rank and split over 2 and 4 ---
run 1 "${common[@]}" --metrics "$work/tp1.jsonl" --ckpt-dir "$work/sft-ckpt" || {
  cat "$work/last.err"
  echo "the 1-rank reference failed"
  exit 1
}
compare "TP 2" "$work/tp1.jsonl" 2 "${common[@]}" --tensor-parallel 2
if grep -q "x tensor parallel 2 (each rank 4 of 8 heads, 96 of 192 MLP columns, 256 of 512" \
  "$work/last.err" "$work/last.out"; then
  pass "the log names the process grid and each rank's slice"
else
  fail "the log names the process grid and each rank's slice"
  head -3 "$work/last.err"
fi
compare "TP 4" "$work/tp1.jsonl" 4 "${common[@]}" --tensor-parallel 4
compare "TP 2 x CP 2" "$work/tp1.jsonl" 4 "${common[@]}" --tensor-parallel 2 --context-parallel 2
compare "TP 2 x 2 data-parallel groups, ZeRO-2" "$work/tp1.jsonl" 4 "${common[@]}" \
  --tensor-parallel 2 --shard-gradients
compare "TP 2 x 2 data-parallel groups, ZeRO-3" "$work/tp1.jsonl" 4 "${common[@]}" \
  --tensor-parallel 2 --shard-parameters
compare "TP 2 with --recompute" "$work/tp1.jsonl" 2 "${common[@]}" --tensor-parallel 2 --recompute
tied=("${common[@]}")
tied[2]="$work/tp-tied.json"
if run 1 "${tied[@]}" --metrics "$work/tied1.jsonl"; then
  compare "TP 2, tied embeddings" "$work/tied1.jsonl" 2 "${tied[@]}" --tensor-parallel 2
else
  fail "tied embeddings on 1 rank ran"
fi

# --- DPO and reward models: the objectives over the group's slices ---
pref=(--init "$work/sft-ckpt" --data "$work/pref" --val-data "$work/pref" --seq-len 128
  --global-batch 4 --micro-batch 2 --lr 1e-3 --steps 5 --eval-every 5 --log-every 0 --no-progress)
if run 1 dpo "${pref[@]}" --metrics "$work/dpo-1.jsonl"; then
  compare "dpo, TP 2" "$work/dpo-1.jsonl" 2 dpo "${pref[@]}" --tensor-parallel 2
else
  fail "dpo on 1 rank ran"
  tail -3 "$work/last.err"
fi
# A reward model's evaluation after 5 steps: its mean reward is a small difference of scores
# that AdamW's first, sign-like updates move by fp32 reduction-order noise (CP 2 moves it by
# 6e-5 on this model too, pure data parallelism by 1e-6); the losses and gradient norms are held
# to 1e-5, the evaluation's figures to 1e-4.
if run 1 reward "${pref[@]}" --metrics "$work/rm-1.jsonl" &&
  run 2 reward "${pref[@]}" --tensor-parallel 2 --metrics "$work/rm-2.jsonl"; then
  read -r steps evals <<<"$(differences "$work/rm-1.jsonl" "$work/rm-2.jsonl" apart)"
  check "reward, TP 2: the 1-rank run's losses and gradient norms within 1e-5 ($steps)" \
    within "$steps" 1e-5
  check "reward, TP 2: the 1-rank run's evaluation within 1e-4 ($evals)" within "$evals" 1e-4
else
  fail "reward on 1 rank and TP 2 ran"
  tail -3 "$work/last.err"
fi

# --- kill and resume; checkpoints that do not depend on the layout ---
restart=(sft --model "$work/tp.json" --data "$work/sft" --seq-len 128 --global-batch 4
  --micro-batch 2 --lr 3e-3 --warmup 2 --steps 12 --checkpoint-every 4 --log-every 0 --no-progress)
run 2 "${restart[@]}" --tensor-parallel 2 --ckpt-dir "$work/ref" --metrics "$work/ref.jsonl" || {
  cat "$work/last.err"
  echo "the uninterrupted TP 2 run failed"
  exit 1
}
L3_FAULT="train.update@1#7=kill" run 2 "${restart[@]}" --tensor-parallel 2 --ckpt-dir "$work/killed"
rc=$?
run 2 "${restart[@]}" --tensor-parallel 2 --ckpt-dir "$work/killed"
if [[ $rc -ne 0 && -n "$(digest "$work/ref/step-00000012")" ]] &&
  [[ "$(digest "$work/killed/step-00000012")" == "$(digest "$work/ref/step-00000012")" ]]; then
  pass "TP 2 killed in step 7 and resumed: bit for bit"
else
  fail "TP 2 killed in step 7 and resumed: bit for bit (first exit $rc)"
  tail -2 "$work/last.err"
fi
# Each rank holds its columns of every row of o_proj and down_proj (row-parallel): one block
# slice per rank in the manifest ([first, count, hashes, rows, stride]), not one per row.
read -r rowpar most blocks < <(python3 - "$work/ref/step-00000004/manifest.json" <<'PY'
import json, sys
tensors = json.load(open(sys.argv[1]))["tensors"]
rowpar = [t for t in tensors if t["name"].endswith(("o_proj.weight", "down_proj.weight"))]
print(len(rowpar), max(len(t["slices"]) for t in rowpar),
      sum(len(s) == 7 and s[5] == t["shape"][0] for t in rowpar for s in t["slices"]))
PY
)
check "TP 2's checkpoint: o_proj and down_proj in one block slice per rank ($rowpar tensors, at most ${most:-?} slices each, ${blocks:-?} blocks of every row)" \
  test "${rowpar:-0}" -eq 4 -a "${most:-0}" -eq 2 -a "${blocks:-0}" -eq 8
# resumed_from SOURCE_DIR RANKS NAME ARGS...: SOURCE_DIR's step 4 resumed on another layout,
# steps 5-12 against the uninterrupted TP 2 run's.
resumed_from() {
  local source=$1 ranks=$2 name=$3
  shift 3
  local dir="$work/moved-$((++runs))"
  mkdir -p "$dir" && cp -r "$source/step-00000004" "$dir/" && echo step-00000004 >"$dir/latest"
  if run "$ranks" "${restart[@]}" "$@" --ckpt-dir "$dir" --resume auto \
    --metrics "$dir/metrics.jsonl"; then
    local worst
    worst=$(paste <(grep -o '"loss":[^,]*' "$work/ref.jsonl" | tail -8 | cut -d: -f2) \
      <(grep -o '"loss":[^,]*' "$dir/metrics.jsonl" | cut -d: -f2) |
      awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d; n++} END {if (n != 8) m = 1; printf "%g", m}')
    check "$name: losses within 1e-5 ($worst)" within "$worst" 1e-5
  else
    fail "$name"
    tail -3 "$work/last.err"
  fi
}
resumed_from "$work/ref" 1 "TP 2's step 4 resumed on 1 rank"
resumed_from "$work/ref" 4 "TP 2's step 4 resumed on TP 4" --tensor-parallel 4
resumed_from "$work/ref" 4 "TP 2's step 4 resumed on TP 2 x CP 2 with ZeRO-3" \
  --tensor-parallel 2 --context-parallel 2 --shard-parameters
run 1 "${restart[@]}" --ckpt-dir "$work/one" || fail "the 1-rank run with checkpoints ran"
resumed_from "$work/one" 2 "the 1-rank run's step 4 resumed on TP 2" --tensor-parallel 2

# --- what it refuses ---
refused "tiny (2 key/value heads) over 4 ranks" 4 "2 key/value heads, which do not divide" \
  sft --model tiny --data "$work/sft" --seq-len 128 --global-batch 4 --steps 1 --tensor-parallel 4
refused "3 ranks in groups of 2" 3 "must split into groups of 2" \
  sft --model "$work/tp.json" --data "$work/sft" --seq-len 128 --global-batch 3 --steps 1 \
  --tensor-parallel 2
refused "LoRA with --tensor-parallel" 2 "not with --lora-rank so far" \
  sft --model "$work/tp.json" --data "$work/sft" --seq-len 128 --global-batch 2 --steps 1 \
  --tensor-parallel 2 --lora-rank 4

finish_checks "tensor-parallel checks"
