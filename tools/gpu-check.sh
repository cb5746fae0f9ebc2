#!/usr/bin/env bash
# The one-shot GPU check, run on a GPU node with the bundled executables on PATH, in order of
# value, each stage with its own time limit and the whole within a budget (L3_GPU_CHECK_BUDGET
# seconds, default 540: a stage that would start later is skipped and says so):
#   1. version report and GPU smoke test;
#   2. the GPU test suite (every CUDA op and the tiny model against the CPU reference; ZeRO-2's
#      and fp32 gradient accumulation);
#   3. cuDNN attention's deterministic backward against its non-deterministic one (l3-bench-gpu
#      --attention-variants: 1B and 8B layer shapes at 2048 and 8192 tokens, packed segments,
#      forward + backward, each variant's workspace, the 0.85 gate of the default's choice);
#   4. training throughput and MFU (l3-bench-train-throughput) of the 1B shape, SFT and reward,
#      with the program's default options, then the Hugging Face baseline of the same shapes
#      (bench/baselines/hf_train.py) where the node's python3 has torch;
#   5. decoding on the Llama-3.2-1B shape (l3-bench-generate --model llama3.2-1b: batch 1
#      against the weights' read bound, batch 64 against the training forward, CUDA graphs on
#      and off);
#   6. a GRPO step on the 1B shape (l3-bench-grpo --model llama3.2-1b: its generation share,
#      completions packed and padded, LoRA);
#   6b. asynchronous GRPO on two ranks sharing the device (l3-bench-grpo --async: synchronous
#      against 1 generating + 1 training rank, --max-staleness 1; "grpo_async");
#   7. training through the program (tests/gpu/training_test.sh: CPU trajectory, two default
#      runs and a killed-and-resumed run bit-identical, NCCL on one rank, two ranks sharing the
#      GPU through MPI);
#   8. the 8B shape with default options (and its baseline), the 1B SFT with the fallback and
#      with cuDNN's non-deterministic backward (the alternatives' figures);
#   9. the op benchmark (l3-bench-gpu: bf16 GEMM rate, copy bandwidth, per-op times), then
#      numerical parity with transformers on identical weights (bench/baselines/hf_parity.py);
#  10. LoRA against full fine-tuning (l3-bench-lora), generation and GRPO on the mid model;
#  11. compute-sanitizer memcheck of one cuDNN attention test, if time is left.
# L3_GPU_CHECK_ONLY=REGEX runs only the stages whose names match (grep -E), for a second call on
# the same machine that runs what the first one's budget skipped (its "skipped_stages"), e.g.
#   L3_GPU_CHECK_ONLY='8B|op benchmark|LoRA' bash .gpubundle/run.sh bash tools/gpu-check.sh OUT2
# Writes under OUTDIR: logs, tests.xml (JUnit), tests-progress.log (each test's start, failures
# and end as they happen) and gpu-<date>-<gpu>.json (tools/gpu_check_summary.py), the results
# file committed to bench/results/ (schema in docs/GPU.md).
#   bash .gpubundle/run.sh bash tools/gpu-check.sh OUTDIR
# L3_GPU_CHECK_REHEARSAL=1: the same stages at toy sizes, to rehearse this script on the CPU
# emulation of the CUDA backend (tests/gpu/gpu_check_rehearsal.sh, in CI): the op benchmark's
# --rehearsal shapes, the tiny training cases at one row for two steps, the training checks on
# the CPU backend (their self-check mode), no Hugging Face baseline, the parity stage's
# llama3-hpc side only (briefly trained models; no transformers there), the LoRA, generation and
# GRPO benchmarks' toy shapes (--rehearsal --quick).
set -uo pipefail
out=${1:?usage: gpu-check.sh OUTDIR}
# The node has no network: transformers must not look for anything on the Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
start=$(date +%s)
# 540 s: the device tool gives one command 600 s, and the bundle's unpacking before this script
# and the summary after the last stage need some of them.
budget=${L3_GPU_CHECK_BUDGET:-540}
skipped=()
rehearsal=${L3_GPU_CHECK_REHEARSAL:-0}
bench_args=()
train_args=()
# The GPU suite's test spec (Catch2's): all of it on a GPU.
test_spec=()
zero2_spec=()
if [[ $rehearsal == 1 ]]; then
  bench_args=(--rehearsal)
  train_args=(--micro-batch 1 --steps 1 --warmup 1)
  export L3_GPU_TEST_BACKEND=cpu
  # The rehearsal rehearses the stages, not the tests (ctest's gpu/ tests run every case on the
  # emulation): it leaves out the four cases that take 98 of its 125 s there, and runs one of
  # the ZeRO-2 test's two cases (11 s each).
  test_spec=('~"sample_tokens draws*" ~"sample_tokens with*" ~"a few training steps*" ~"a captured op replays*"')
  zero2_spec=('an fp32 gradient buffer*')
fi
# stage NAME LIMIT: true when there is time left for a stage of up to LIMIT seconds.
only=${L3_GPU_CHECK_ONLY:-}
stage() {
  if [[ -n $only ]] && ! grep -qE -- "$only" <<<"$1"; then
    echo "== $1: not selected (L3_GPU_CHECK_ONLY)"
    return 1
  fi
  local left=$((budget - ($(date +%s) - start)))
  if ((left < $2 / 3)); then
    echo "== $1: skipped ($left s of the budget left)"
    skipped+=("$1")
    return 1
  fi
  echo "== $1 ($(($(date +%s) - start)) s in)"
}
limit() { # the smaller of a stage's limit and what is left of the budget (at least 1 s)
  local left=$((budget - ($(date +%s) - start)))
  left=$((left < 1 ? 1 : left))
  echo $(($1 < left ? $1 : left))
}
# On the GPU, the training checks' runs (seconds each) end well within their stage: a run left
# behind by the stage's time limit would go on competing with the benchmarks.
[[ $rehearsal == 1 ]] || export L3_GPU_TEST_RUN_TIMEOUT=${L3_GPU_TEST_RUN_TIMEOUT:-100}

llama3-hpc --version | tee "$out/version.txt"
smoke=-1
if command -v l3_gpu_device_smoke_test >/dev/null; then
  timeout 60 l3_gpu_device_smoke_test 2>&1 | tee "$out/smoke.log"
  smoke=${PIPESTATUS[0]}
else
  echo "== GPU smoke test: no l3_gpu_device_smoke_test here" | tee "$out/smoke.log"
fi

tests_rc=-1
zero2_rc=-1
if stage "GPU tests" 240; then
  # The JUnit report comes only at the end; the progress log, line by line, survives a kill.
  # --foreground: the suite alone gets one SIGTERM. Without it timeout signals the suite and then
  # its process group, and the second SIGTERM, landing on another thread after Catch2's handler
  # has restored the default action, ends the process before the running test is logged as ended
  # (2 of 8 kills in the rehearsal, 0 of 10 with --foreground); -k 10: SIGKILL if that hangs.
  L3_TEST_PROGRESS_FILE="$out/tests-progress.log" timeout --foreground -k 10 "$(limit 240)" l3_gpu_tests \
    ${test_spec[@]+"${test_spec[@]}"} --reporter junit --out "$out/tests.xml" >"$out/tests.log" 2>&1
  tests_rc=$?
fi
# ZeRO-2's and fp32 accumulation on the GPU (an MPI test of one rank, started as a singleton).
if command -v l3_gpu_zero2_test >/dev/null && stage "ZeRO-2 accumulation test" 60; then
  L3_TEST_PROGRESS_FILE="$out/tests-zero2-progress.log" timeout --foreground -k 10 "$(limit 120)" l3_gpu_zero2_test \
    ${zero2_spec[@]+"${zero2_spec[@]}"} --reporter junit --out "$out/tests-zero2.xml" >"$out/tests-zero2.log" 2>&1
  zero2_rc=$?
fi

# train ATTENTION CASE...: llama3-hpc's throughput rows into train-CASE[-ATTENTION].json;
# ATTENTION default: no --attention (the program's default; rows marked "default_options").
train() {
  local attention=$1
  shift
  for c in "$@"; do
    local suffix=""
    [[ $attention == default ]] || suffix="-$attention"
    if stage "throughput $c$suffix" 120; then
      local choice=()
      [[ $attention == default ]] || choice=(--attention "$attention")
      timeout "$(limit 180)" l3-bench-train-throughput --case "$c" --peak-tflops "$peak" \
        ${choice[@]+"${choice[@]}"} ${train_args[@]+"${train_args[@]}"} --json "$out/train-$c$suffix.json" 2>&1 |
        tee -a "$out/train.log"
      local rc=${PIPESTATUS[0]}
      # The benchmark writes its rows at the end: a case that failed or ran out of time leaves a
      # row saying so, not a silent gap.
      if [[ $rc -ne 0 || ! -s "$out/train-$c$suffix.json" ]]; then
        echo "{\"training\": [{\"impl\": \"llama3-hpc\", \"case\": \"$c\", \"attention\": \"$attention\", \"error\": \"exit $rc\"}]}" \
          >"$out/train-$c$suffix.json"
      fi
    fi
  done
}
# hf_ready: the node's python3 has torch and a transformers that knows Llama 3's RoPE scaling
# ("rope_type": "llama3", transformers 4.43 and later).
hf_state=""
hf_ready() {
  [[ -z $hf_state ]] || { [[ $hf_state == yes ]]; return; }
  hf_state=no
  python3 -c '
import sys, torch, transformers
major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (4, 43) else 1)' 2>/dev/null && hf_state=yes
  [[ $hf_state == yes ]]
}
# baseline CASE...: the transformers run of the shape llama3-hpc ran for CASE: the same micro-batch
# (halved inside hf_train.py after an out-of-memory), gradient checkpointing where llama3-hpc
# recomputed, the same datasheet peak.
baseline() {
  for c in "$@"; do
    [[ -f "$out/train-$c.json" ]] || continue
    stage "transformers $c" 120 || continue
    hf_ready || {
      echo "== transformers baseline: no torch, or no transformers 4.43 or later, here"
      return
    }
    read -r model layers phase seq batch recompute datasheet < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["training"][0]
m = r["model"]
base, layers = (m.split("-")[0] + "-" + m.split("-")[1], m.split("-")[2].replace("layers", "")) if m.endswith("layers") else (m, "0")
print(base, layers, r["phase"], r["seq"], r["micro_batch"], int(bool(r.get("recompute"))), r.get("datasheet_tflops", 0))' "$out/train-$c.json") || continue
    local extra=()
    [[ $recompute == 1 ]] && extra+=(--gradient-checkpointing)
    echo "   micro-batch $batch$([[ $recompute == 1 ]] && echo ', gradient checkpointing')"
    timeout "$(limit 240)" python3 "$root/bench/baselines/hf_train.py" --model "$model" \
      --layers "$layers" --phase "$phase" --seq "$seq" --micro-batch "$batch" \
      --peak-tflops "$peak" --datasheet-tflops "$datasheet" ${extra[@]+"${extra[@]}"} \
      --json "$out/hf-$c.json" 2>>"$out/hf-errors.log" | tee -a "$out/hf.log"
    local rc=${PIPESTATUS[0]}
    # Killed by the time limit: the row (if any) is not this run's outcome.
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "{\"impl\": \"transformers\", \"case\": \"$c\", \"error\": \"timed out (exit $rc)\"}" >"$out/hf-$c.json"
    fi
  done
}
# parity: llama3-hpc's log-probabilities and rewards against transformers' on the same exported
# weights (CPU work; the stage gives it up to 150 s).
parity_rc=-1
parity() {
  stage "HF parity" 150 || return
  if [[ $rehearsal != 1 ]] && ! hf_ready; then
    echo "== HF parity: no torch, or no transformers 4.43 or later, here"
    return
  fi
  # 120 + 60 steps train the demo's models far enough for a meaningful comparison: 82 s on two
  # CPU cores (docs/GPU.md); the script writes each variant's row as soon as it has it.
  local steps=(--sft-steps 120 --reward-steps 60)
  [[ $rehearsal == 1 ]] && steps=(--sft-steps 20 --reward-steps 10)
  local work="${TMPDIR:-/tmp}/l3-hf-parity-$$"
  timeout "$(limit 150)" python3 "$root/bench/baselines/hf_parity.py" --llama3-hpc llama3-hpc \
    --workdir "$work" --json "$out/parity.json" "${steps[@]}" 2>&1 | tee "$out/parity.log"
  parity_rc=${PIPESTATUS[0]}
  cp "$work/llama3-hpc.log" "$out/parity-llama3-hpc.log" 2>/dev/null
  rm -rf "$work"
}
# cuDNN's deterministic backward against its non-deterministic one (bench/gpu_ops.cpp
# --attention-variants): whether the default (--attention auto) keeps 0.85 of the fast one.
# --quick: the packed rows only (each cuDNN plan compiles at run time); the one-document rows run
# alone in a follow-up call (L3_GPU_CHECK_ONLY='attention variants', L3_GPU_CHECK_ATTENTION_FULL=1).
attention_rc=-1
if stage "attention variants" 60; then
  attention_args=(--quick)
  [[ ${L3_GPU_CHECK_ATTENTION_FULL:-0} == 1 ]] && attention_args=()
  [[ $rehearsal == 1 ]] && attention_args=(--rehearsal)
  timeout "$(limit 120)" l3-bench-gpu --attention-variants ${attention_args[@]+"${attention_args[@]}"} \
    --json "$out/attention-variants.json" 2>&1 | tee "$out/attention-variants.log"
  attention_rc=${PIPESTATUS[0]}
fi

# decode NAME MODEL RC_VAR: l3-bench-generate on that model into generate.json (mid) or
# generate-NAME.json, its exit code into RC_VAR (left at -1 where the stage did not run);
# grpo_step likewise with l3-bench-grpo.
generate_rc=-1
generate_1b_rc=-1
decode() {
  # (graphs, then per pass, at each batch: up to 150 s for the 1B shape)
  command -v l3-bench-generate >/dev/null && stage "generation benchmark $1" 150 || return 0
  local args=(--backend cuda --model "$2") file=generate.json
  [[ $rehearsal == 1 ]] && args+=(--rehearsal --quick)
  [[ $1 == mid ]] || file="generate-$1.json"
  timeout "$(limit 150)" l3-bench-generate "${args[@]}" --json "$out/$file" 2>&1 | tee -a "$out/generate.log"
  printf -v "$3" '%s' "${PIPESTATUS[0]}"
}
grpo_rc=-1
grpo_1b_rc=-1
grpo_step() {
  command -v l3-bench-grpo >/dev/null && stage "GRPO benchmark $1" 120 || return 0
  local args=(--backend cuda) file=grpo.json
  [[ $1 == mid ]] || args+=(--model "$2")
  [[ $rehearsal == 1 ]] && args+=(--rehearsal --quick)
  [[ $1 == mid ]] || file="grpo-$1.json"
  timeout "$(limit 120)" l3-bench-grpo "${args[@]}" --json "$out/$file" 2>&1 | tee -a "$out/grpo.log"
  printf -v "$3" '%s' "${PIPESTATUS[0]}"
}

# In order of value (issue 59): the default options' speed first, the alternatives after.
peak=0 # the measured bf16 GEMM rate, from the op benchmark (later): until then rows have only
#        "mfu_datasheet", against the GPU's datasheet peak
if [[ $rehearsal == 1 ]]; then
  sft=tiny-sft reward=tiny-reward big=tiny-sft
else
  sft=1b-sft reward=1b-reward big=8b-sft
fi
train default "$sft" "$reward"
[[ $rehearsal == 1 ]] || baseline "$sft" "$reward"
decode 1b llama3.2-1b generate_1b_rc
grpo_step 1b llama3.2-1b grpo_1b_rc
# Asynchronous GRPO: two ranks sharing the device, the synchronous step on both against one
# generating and one training rank with --max-staleness 1 (bench/grpo.cpp --async).
grpo_async_rc=-1
mpiexec_cmd=$(command -v mpiexec.hydra || command -v mpiexec || true)
if command -v l3-bench-grpo >/dev/null && [[ -n $mpiexec_cmd ]] && stage "asynchronous GRPO" 120; then
  async_args=(--backend cuda --async)
  [[ $rehearsal == 1 ]] && async_args+=(--quick)
  timeout "$(limit 120)" "$mpiexec_cmd" -n 2 l3-bench-grpo "${async_args[@]}" \
    --json "$out/grpo-async.json" 2>&1 | tee -a "$out/grpo.log"
  grpo_async_rc=${PIPESTATUS[0]}
fi
training_rc=-1
if stage "training tests" 240; then
  timeout "$(limit 240)" bash "$root/tests/gpu/training_test.sh" "$(command -v llama3-hpc)" \
    "$(command -v mpiexec.hydra || command -v mpiexec || true)" 2>&1 | tee "$out/training-tests.log"
  training_rc=${PIPESTATUS[0]}
fi

if [[ $rehearsal != 1 ]]; then
  train default "$big"
  baseline "$big"
fi
train fallback "$sft"
train cudnn-nondeterministic "$sft"
bench_rc=-1
op_benchmark() {
  stage "op benchmark" 150 || return
  timeout "$(limit 150)" l3-bench-gpu ${bench_args[@]+"${bench_args[@]}"} --json "$out/bench.json" 2>&1 |
    tee "$out/bench.log"
  bench_rc=${PIPESTATUS[0]}
  peak=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("gemm_tflops", 0))' \
    "$out/bench.json" 2>/dev/null || echo 0)
}

op_benchmark
parity

# LoRA against full fine-tuning on the same model and batch, in one run (bench/lora.cpp).
lora_rc=-1
if command -v l3-bench-lora >/dev/null && stage "LoRA benchmark" 90; then
  lora_args=(--backend cuda)
  [[ $rehearsal == 1 ]] && lora_args+=(--rehearsal --quick)
  timeout "$(limit 90)" l3-bench-lora "${lora_args[@]}" --json "$out/lora.json" 2>&1 | tee "$out/lora.log"
  lora_rc=${PIPESTATUS[0]}
fi

# Generation and GRPO on the mid model (the earlier checks' shape, for comparison). Not in the
# rehearsal: there both shapes are its toy one, run by the 1B stages already.
if [[ $rehearsal != 1 ]]; then
  decode mid mid generate_rc
  grpo_step mid mid grpo_rc
fi

# Last, while time is left: cuDNN's attention under compute-sanitizer's memcheck (reads past the
# last packed token are possible in principle with ragged layouts; the tests see only writes).
memcheck_rc=-1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -z $sanitizer ]]; then
  echo "== memcheck cuDNN attention: no compute-sanitizer here"
  # On a GPU node its absence is a stage not run; the rehearsal has none by design.
  [[ $rehearsal == 1 ]] || skipped+=("memcheck cuDNN attention (no compute-sanitizer)")
elif stage "memcheck cuDNN attention" 150; then
  # Catch2 reads a comma as "or" between test names: the name's commas are escaped, and a name
  # that matches nothing fails (--warn NoTests) instead of checking nothing.
  timeout "$(limit 150)" "$sanitizer" --tool memcheck --error-exitcode 9 l3_gpu_tests \
    'cuDNN attention\, GQA 8/2 heads\, head_dim 64\, segments of 37 3 260 1 119' --warn NoTests \
    >"$out/memcheck.log" 2>&1
  memcheck_rc=$?
  tail -3 "$out/memcheck.log"
fi

L3_GPU_CHECK_LORA_RC=$lora_rc L3_GPU_CHECK_GENERATE_RC=$generate_rc L3_GPU_CHECK_GRPO_RC=$grpo_rc \
  L3_GPU_CHECK_GENERATE_1B_RC=$generate_1b_rc L3_GPU_CHECK_GRPO_1B_RC=$grpo_1b_rc \
  L3_GPU_CHECK_GRPO_ASYNC_RC=$grpo_async_rc \
  L3_GPU_CHECK_ATTENTION_RC=$attention_rc python3 "$root/tools/gpu_check_summary.py" "$out" "$smoke" "$tests_rc" "$training_rc" "$bench_rc" "$memcheck_rc" \
  "$(($(date +%s) - start))" "$rehearsal" "$parity_rc" "$zero2_rc" "$(
    IFS=';'
    echo "${skipped[*]:-}"
  )"
