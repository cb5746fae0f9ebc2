#!/usr/bin/env bash
# The program's contract at its edge: help, version, exit codes (0 ok, 2 usage/bad input,
# 1 internal, 75 checkpointed) and one-line errors printed once, alone and under mpiexec.
#   cli_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=${1:?usage: cli_test.sh LLAMA3_HPC MPIEXEC}
mpiexec=${2:?usage: cli_test.sh LLAMA3_HPC MPIEXEC}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"

# --- help and version: no MPI needed ---
run "top-level help" 0 "$bin" --help
for cmd in prep sft reward dpo grpo eval generate score export tokenize ckpt demo info report; do
  expect "help lists $cmd" contains "$out" "  $cmd "
done
run "no arguments is a usage error" 2 "$bin"
expect "usage goes to stderr" contains "$err" "Usage: llama3-hpc"
run "version" 0 "$bin" --version
expect "version names the program" contains "$out" "llama3-hpc 0."
expect "version lists MPI" contains "$out" "MPI: "
expect "version lists HDF5" contains "$out" "HDF5: "
expect "version lists the cpu backend" contains "$out" "backend cpu:"
expect "version names the OpenBLAS core" contains "$out" "OpenBLAS core "
run "subcommand help" 0 "$bin" info --help
expect "subcommand help shows its options" contains "$out" "--json"
expect "subcommand help shows common options" contains "$out" "--config"
run "export help" 0 "$bin" export --help
expect "shows its options" contains "$out" "--shard-size"
run "sft help" 0 "$bin" sft --help
expect "shows the batch options" contains "$out" "--global-batch"
run "reward help" 0 "$bin" reward --help
expect "shows the reward options" contains "$out" "--center-rewards"
run "dpo help" 0 "$bin" dpo --help
expect "shows the DPO options" contains "$out" "--label-smoothing"

# --- usage errors: one line, exit 2 ---
run "unknown command" 2 "$bin" train
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names the command" contains "$err" "'train'"
run "a mistyped command" 2 "$bin" sfft
expect "suggests sft" contains "$err" "unknown command 'sfft'; did you mean sft?"
run "a mistyped top-level option" 2 "$bin" --verison
expect "suggests --version" contains "$err" "did you mean --version?"
run "another tool's option name" 2 "$bin" sft --lr-warmup 10
expect "suggests --warmup" contains "$err" "did you mean --warmup?"
run "unknown top-level option" 2 "$bin" --frobnicate
run "export without --output" 2 "$bin" export --ckpt x
expect "says what is missing" contains "$err" "--output DIR is required"
run "a mistyped option" 2 "$bin" sft --warm 10
expect "one error line, the option it meant" [ "$(error_lines "$err")" = 1 ]
expect "did you mean --warmup" contains "$err" "unrecognised option '--warm'; did you mean --warmup?"
run "another trainer's name" 2 "$bin" dpo --learning-rate 1e-5
expect "did you mean --lr" contains "$err" "did you mean --lr?"
run "a name cut short" 2 "$bin" eval --shard-parameter
expect "did you mean --shard-parameters" contains "$err" "did you mean --shard-parameters?"
printf 'warm = 3\n' >"$work/mistyped.ini"
run "a mistyped key in a config file" 2 "$bin" sft --config "$work/mistyped.ini"
expect "names the file, did you mean warmup" contains "$err" "mistyped.ini: unrecognised option 'warm'; did you mean warmup?"

# --- tokenize: a stream filter ---
printf '{"text":"Hi"}\n\n{"text":"<|eot_id|>"}\n' >"$work/text.jsonl"
run "tokenize with the bytes tokenizer" 0 "$bin" tokenize --tokenizer bytes --bos --eos <"$work/text.jsonl"
expect "ids with BOS and EOS" contains "$out" '{"ids":[256,72,105,257]}'
expect "special text stays text" contains "$out" '{"ids":[256,60,124,101,111,116,95,105,100,124,62,257]}'
printf '{"text":"ok"}\n{"txt":1}\n' >"$work/bad.jsonl"
run "tokenize names the bad line" 2 "$bin" tokenize --tokenizer bytes <"$work/bad.jsonl"
expect "stdin:2" contains "$err" 'error: stdin:2: expected an object with a string "text"'
run "tokenize needs --tokenizer" 2 "$bin" tokenize <"$work/text.jsonl"

# --- prep ---
printf '%s\n' '{"prompt":"Q1","completion":"A1"}' '{"text":"hello"}' '{"messages":[{"role":"user","content":"u"},{"role":"assistant","content":"a"}]}' >"$work/sft.jsonl"
run "prep sft" 0 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds"
expect "summary" contains "$out" "prep sft: 3 records read, 3 kept"
expect "index.json" [ -f "$work/ds/index.json" ]
run "prep refuses to overwrite" 2 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds"
expect "says why" contains "$err" "exists"
run "prep --overwrite" 0 "$bin" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/ds" --overwrite
gzip -c "$work/sft.jsonl" >"$work/sft-gz.jsonl.gz"
run "prep reads .jsonl.gz" 0 "$bin" prep sft --input "$work/sft-gz.jsonl.gz" --tokenizer bytes --output "$work/ds-gz"
expect "3 kept from gzip" contains "$out" "3 records read, 3 kept"
printf '%s\n' '{"prompt":"Q","chosen":"good","rejected":"bad"}' >"$work/pref.jsonl"
run "prep preference on 2 ranks" 0 "$mpiexec" -n 2 "$bin" prep preference --input "$work/pref.jsonl" --tokenizer bytes --output "$work/pref"
expect "one pair" contains "$out" "1 kept"
printf '%s\n' '{"text":"ok"}' '{"text": 5}' >"$work/bad-record.jsonl"
run "a bad record: file:line, exit 2" 2 "$mpiexec" -n 2 "$bin" prep sft --input "$work/bad-record.jsonl" --tokenizer bytes --output "$work/never"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names file and line" contains "$err" "bad-record.jsonl:2: \"text\" must be a string"
expect "nothing written" [ ! -e "$work/never" ]
run "prep without a kind" 2 "$bin" prep --input "$work/sft.jsonl" --tokenizer bytes --output "$work/x"
run "prep with a missing input" 2 "$bin" prep sft --input "$work/none-*.jsonl" --tokenizer bytes --output "$work/x"
expect "names the pattern" contains "$err" "none-*.jsonl: no input file matches"

# --- single process (MPI singleton) ---
run "info runs" 0 "$bin" info
expect "info reports the world" contains "$out" "world:     1 rank on 1 node"
expect "info self-check passes" contains "$out" "allreduce over 1 ranks: ok"
expect "info names the OpenBLAS core" contains "$out" "OpenBLAS core "
run "info --json" 0 "$bin" info --json
expect "json has world_size" contains "$out" '"world_size":1'
run "bad option" 2 "$bin" info --bogus
expect "one line for a bad option" [ "$(lines "$err")" = 1 ]
expect "names the option" contains "$err" "bogus"
run "bad log level" 2 "$bin" info --log-level loud
expect "names the level" contains "$err" "loud"

printf 'json = true\n# comment\n' >"$work/good.ini"
run "options from a config file" 0 "$bin" info --config "$work/good.ini"
expect "config json=true took effect" contains "$out" '"world_size":1'
printf 'json = true\nnot-an-option = 3\n' >"$work/bad.ini"
run "unknown key in a config file" 2 "$bin" info --config "$work/bad.ini"
expect "names the file" contains "$err" "error: $work/bad.ini: "
expect "names the key" contains "$err" "not-an-option"
run "missing config file" 2 "$bin" info --config "$work/missing.ini"
expect "names the missing file" contains "$err" "$work/missing.ini: cannot read: No such file or directory"

# --- under mpiexec: printed once by rank 0, same exit code from the launcher ---
run "info on 2 ranks" 0 "$mpiexec" -n 2 "$bin" info
expect "2 ranks" contains "$out" "world:     2 ranks on 1 node"
expect "printed once" [ "$(printf '%s\n' "$out" | grep -c '^world:')" = 1 ]
run "info shows a training grid" 0 "$mpiexec" -n 4 "$bin" info --tensor-parallel 2 --context-parallel 2 --json
expect "each rank's grid coordinates (rank = (data x C + context) x T + tensor)" [ "$(printf '%s\n' "$out" | python3 -c 'import json,sys; print(" ".join("{data}{context}{tensor}".format(**r["grid"]) for r in json.load(sys.stdin)["ranks"]))')" = "000 001 010 011" ]
expect "the groups inside one node" contains "$out" "every tensor group inside one node; every context group inside one node"
L3_PRETEND_NODES=2 run "info: tensor groups across pretended nodes" 0 "$mpiexec" -n 4 "$bin" info --tensor-parallel 4
expect "a warning names the groups that leave the node" contains "$out" "warning: tensor groups span nodes"
run "info: a grid the ranks do not divide into" 2 "$mpiexec" -n 4 "$bin" info --tensor-parallel 3
run "demo on 2 ranks" 0 "$mpiexec" -n 2 "$bin" demo --workdir "$work/demo" --sft-steps 20 --reward-steps 10 --dpo-steps 5 --grpo-steps 4
expect "the demo prints its report's path" contains "$out" "the curves: $work/demo/report.html"
report_sections=$(grep -o '<section[^>]*data-phase="[a-z]*"' "$work/demo/report.html" | grep -o '"[a-z]*"' | tr -d '"' | tr '\n' ' ')
expect "the demo's report: a section per phase" [ "$report_sections" = "sft reward dpo grpo " ]
tb_phases=$(for p in sft reward dpo grpo; do compgen -G "$work/demo/tensorboard/$p/events.out.tfevents.*" >/dev/null && echo "$p"; done | wc -l)
expect "the demo's TensorBoard files, a directory per phase" [ "$tb_phases" = 4 ]
expect "reports the reward phase" contains "$out" "reward  10 steps: validation accuracy"
expect "reports the DPO phase" contains "$out" "DPO     5 steps: validation reward accuracy"
expect "reports the GRPO phase" contains "$out" "GRPO    4 steps: exact answers of greedy completions on"
expect "GRPO's metrics: evaluations at step 0 and 4" [ "$(grep -c '"kind":"eval"' "$work/demo/metrics-grpo.jsonl")" = 2 ]
expect "says what to run next" contains "$out" "llama3-hpc prep prompts --input \$D/prompts.jsonl"
run "score --json of the demo's reward model" 0 "$bin" score --init "$work/demo/ckpt/reward" --prompt "Reverse abc." --response "cba" --json
expect "the reward, the token count and the ids scored" python3 -c '
import json, sys
r = json.loads(sys.argv[1])
assert isinstance(r["reward"], float) and r["tokens"] == len(r["ids"]) > 4, r' "$out"
# The same scores from weights sharded over 3 ranks (5 records: rounds of 3 and 2, one rank idle).
printf '%s\n' '{"prompt":"Reverse abc.","chosen":"cba","rejected":"abc"}' \
  '{"prompt":"Reverse dog.","response":"god"}' '' \
  '{"prompt":"Reverse sun.","chosen":"nus","rejected":"uns"}' \
  '{"prompt":"Reverse tea.","chosen":"aet","rejected":"tae"}' \
  '{"prompt":"Reverse pen.","response":"nep"}' >"$work/score.jsonl"
# (on 3 ranks both: rank 0's thread budget, and so its sums' rounding, is the same)
run "score --input" 0 "$mpiexec" -n 3 "$bin" score --init "$work/demo/ckpt/reward" --input "$work/score.jsonl"
scores=$out
run "score --input with sharded parameters on 3 ranks" 0 "$mpiexec" -n 3 "$bin" score --init "$work/demo/ckpt/reward" --input "$work/score.jsonl" --shard-parameters
expect "the same scores, in file order" [ "$out" = "$scores" ]
run "score --json with sharded parameters on 2 ranks" 0 "$mpiexec" -n 2 "$bin" score --init "$work/demo/ckpt/reward" --prompt "Reverse abc." --response "cba" --shard-parameters
expect "printed once" [ "$(lines "$out")" = 1 ]
printf '%s\n' '{"prompt":"a","response":"b"}' 'not json' >"$work/score-bad.jsonl"
run "a bad record with sharded parameters" 2 "$mpiexec" -n 2 "$bin" score --init "$work/demo/ckpt/reward" --input "$work/score-bad.jsonl" --shard-parameters
expect "names file:line" contains "$err" "score-bad.jsonl:2"
run "demo --lora" 0 "$bin" demo --lora --workdir "$work/demo-lora" --sft-steps 20 --reward-steps 10 --dpo-steps 0 --grpo-steps 0
expect "no DPO stage with --dpo-steps 0" [ "$(grep -c "^  DPO  " <<<"$out")" = 0 ]
expect "reports the adapters" contains "$out" "(LoRA: "
expect "the PEFT adapter" contains "$(cat "$work/demo-lora/reward-adapter/adapter_config.json")" '"task_type": "SEQ_CLS"'
# PEFT loads base_model_name_or_path with transformers: never a llama3-hpc checkpoint.
expect "no base PEFT could not load" contains "$(cat "$work/demo-lora/reward-adapter/adapter_config.json")" '"base_model_name_or_path": null'
run "export the demo's SFT model for PEFT" 0 "$bin" export --ckpt "$work/demo-lora/ckpt/sft" --output "$work/demo-sft-hf"
run "export --adapter --base-model it" 0 "$bin" export --ckpt "$work/demo-lora/ckpt/reward" --adapter \
  --output "$work/adapter-on-hf" --base-model "$work/demo-sft-hf"
expect "names it" contains "$(cat "$work/adapter-on-hf/adapter_config.json")" "\"base_model_name_or_path\": \"$work/demo-sft-hf\""
run "--base-model without --adapter" 2 "$bin" export --ckpt "$work/demo-lora/ckpt/sft" --output "$work/x" --base-model y
run "score of the LoRA reward checkpoint" 0 "$bin" score --init "$work/demo-lora/ckpt/reward" --prompt "Reverse abc." --response "cba" --json
lora_score=$out
run "score of the SFT model with the demo's PEFT adapter" 0 "$bin" score --init "$work/demo-lora/ckpt/sft" --adapter "$work/demo-lora/reward-adapter" --prompt "Reverse abc." --response "cba" --json
expect "the same reward" [ "$out" = "$lora_score" ]
run "bad option on 2 ranks" 2 "$mpiexec" -n 2 "$bin" info --bogus
expect "exactly one line on stderr" [ "$(lines "$err")" = 1 ]
run "help under mpiexec prints once" 0 "$mpiexec" -n 2 "$bin" --help
expect "one help text" [ "$(printf '%s\n' "$out" | grep -c '^Usage: llama3-hpc <command>')" = 1 ]
run "not built under mpiexec prints once" 2 "$mpiexec" -n 2 "$bin" ckpt list
expect "one error line" [ "$(error_lines "$err")" = 1 ]

# One rank fails after the command's collectives, the others finish: the job exits 2 and
# rank 0 names the failing rank.
L3_FAULT="cli.finished@1=throw-input" run "one rank fails with bad input" 2 "$mpiexec" -n 2 "$bin" info
expect "rank 0 names rank 1" contains "$err" "error: [rank 1] injected fault at cli.finished on rank 1"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
L3_FAULT="cli.run@*=throw-internal" run "every rank fails alike" 1 "$mpiexec" -n 2 "$bin" info
expect "two distinct messages (they name their rank)" [ "$(error_lines "$err")" = 2 ]

# One rank fails while another is stuck: after the grace period the failing rank aborts the
# job with its code instead of leaving it hanging.
L3_ERROR_GRACE_SECONDS=1 L3_FAULT="cli.run@0=sleep:30,cli.run@1=throw-input" \
  run "a failure while a peer is busy aborts the job" 2 "$mpiexec" -n 2 "$bin" info
expect "the failing rank explains" contains "$err" "error: [rank 1/2] injected fault at cli.run on rank 1"
expect "and says why it aborts" contains "$err" "aborting the job"

# Hydra ORs the ranks' wait statuses: when it kills rank 0 (SIGKILL) before that rank ends on its
# own after rank 1's exit, the launcher says 9 (seen once in ~15 CI runs, on 2 busy cores). That
# race is the launcher's; a second try (at most three) must then give rank 1's 75.
for try in 1 2 3; do
  L3_FAULT="cli.run@1=exit:75" "$mpiexec" -n 2 "$bin" info >"$work/launcher.out" 2>&1
  launcher_code=$?
  [[ $launcher_code == 9 ]] || break
  echo "  (try $try: the launcher killed rank 0 first and said 9)"
done
run "a rank's exit code reaches the launcher" 75 bash -c "cat '$work/launcher.out'; exit $launcher_code"

# --- training: bad configurations are one line and exit 2; a short run end to end ---
for i in $(seq 1 40); do
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "word$i" "$(echo "word$i" | rev)"
done >"$work/train.jsonl"
run "prep training data" 0 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train"
run "sft without --global-batch" 2 "$bin" sft --model tiny --data "$work/train"
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names the option" contains "$err" "--global-batch is required"
run "sft with a batch that does not divide" 2 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --global-batch 6 --micro-batch 2
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "says why" contains "$err" "--global-batch 6 must be a multiple of ranks 2 x --micro-batch 2"
run "sft with --seq-len beyond the model" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --seq-len 4096
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names the limit" contains "$err" "--seq-len 4096 is longer than the model's 2048 positions"
run "sft with missing data" 2 "$bin" sft --model tiny --data "$work/no-such-data" --global-batch 2
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names the directory" contains "$err" "$work/no-such-data"
run "sft with an unknown model" 2 "$bin" sft --model llama9 --data "$work/train" --global-batch 2
expect "lists the presets" contains "$err" "tiny"
run "reward on SFT data" 2 "$bin" reward --model tiny --data "$work/train" --global-batch 2
expect "names the format" contains "$err" "this phase needs"
run "an unknown --grad-exchange" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --grad-exchange carrier-pigeon
expect "names the choices" contains "$err" "--grad-exchange takes auto, mpi or nccl"
run "NCCL on the CPU backend" 2 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 --steps 1 --backend cpu --grad-exchange nccl
expect "says NCCL needs CUDA" contains "$err" "--grad-exchange nccl needs the CUDA backend"
run "an unknown --attention" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --attention fast
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names the choices" contains "$err" "--attention takes auto, cudnn, cudnn-nondeterministic or fallback"
run "--attention cudnn-nondeterministic with --deterministic" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --attention cudnn-nondeterministic --deterministic
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names both options" contains "$err" "--attention cudnn-nondeterministic gives up the bit-identical results that --deterministic asks for"
run "cuDNN attention on the CPU backend" 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 --steps 1 --backend cpu --attention cudnn-nondeterministic --no-progress
expect "says it needs CUDA" contains "$err" "--attention cudnn-nondeterministic needs the CUDA backend"
run "sft --help" 0 "$bin" sft --help
expect "--attention's default is auto" contains "$out" "--attention auto|cudnn|cudnn-nondeterministic|fallback (=auto)"
expect "the help says what the non-deterministic choice gives up" contains "$(tr -s ' \n' ' ' <<<"$out")" "cudnn-nondeterministic (cuDNN's faster backward: gives up bit-identical reruns and bitwise restart)"
run "--shard-gradients without the sharded optimizer" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --shard-gradients --no-shard-optimizer
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "says why" contains "$err" "--shard-gradients (ZeRO-2) needs the sharded optimizer"
run "ZeRO-2 on 2 ranks" 0 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --steps 2 --shard-gradients --no-progress
expect "reports ZeRO-2" contains "$err$out" "ZeRO-2,"
run "ZeRO-3 on 2 ranks" 0 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --steps 2 --shard-parameters --no-progress --metrics "$work/z3.jsonl"
expect "reports ZeRO-3" contains "$err$out" "ZeRO-3,"
expect "gather times in the metrics" contains "$(cat "$work/z3.jsonl")" '"gather_wait_ms":'
# The blocks' and the head's gathers start on the prefetch thread while the group before computes.
expect "gathers prefetched" python3 -c '
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"]
sys.exit(0 if steps and all(0 < r["gathers_prefetched"] < r["gathers"] for r in steps) else 1)' "$work/z3.jsonl"
run "hybrid groups that do not divide the ranks" 2 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --steps 1 --shard-parameters --shard-group-size 3 --no-progress
run "--shard-group-size without --shard-parameters" 2 "$bin" sft --model tiny --data "$work/train" --global-batch 2 --shard-group-size 2
expect "says what it needs" contains "$err" "--shard-group-size needs --shard-parameters (ZeRO-3)"
run "--deterministic on 2 ranks" 0 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 --steps 1 --deterministic --no-progress
expect "reports the exchange" contains "$err$out" "(mpi"
run "sft on 2 ranks" 0 "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --val-data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --steps 6 --lr 1e-3 --metrics "$work/m.jsonl" --ckpt-dir "$work/ck" --checkpoint-every 4 --no-progress
expect "a summary line" contains "$out" "sft done: 6 steps"
expect "the log names the OpenBLAS core" contains "$err" "cpu backend: OpenBLAS core "
expect "a metrics line per step" [ "$(grep -c '"kind":"train"' "$work/m.jsonl")" = 6 ]
expect "an eval object" [ "$(grep -c '"kind":"eval"' "$work/m.jsonl")" = 1 ]
expect "latest names the last step" [ "$(cat "$work/ck/latest")" = "step-00000006" ]
expect "the periodic checkpoint too" [ -f "$work/ck/step-00000004/manifest.json" ]
# An internal error on one rank mid-step, the other blocked in the step's collectives: the failing
# rank must not hang in collective cleanup (closing the MPI-IO shards) but report and abort.
L3_FAULT="train.update@1#2=throw-internal" run "one rank fails mid-step" 1 timeout -k 5 60 \
  "$mpiexec" -n 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --steps 6 --no-progress
expect "names the error and the abort" contains "$err" "injected fault at train.update on rank 1 (other ranks did not finish"
# --dry-run-memory: the plan per rank, without data, allocating and writing nothing.
run "sft --dry-run-memory" 0 "$bin" sft --model llama3-8b --seq-len 8192 --dry-run-memory \
  --dry-run-ranks 8 --backend cuda --ckpt-dir "$work/never"
expect "plans for 8 ranks in bf16" contains "$out" "sft on 8 ranks, cuda (bf16), micro-batch 1 x 8192 tokens"
expect "lists the master weights, sharded" contains "$out" "master weights (fp32, ZeRO-1: 1/8 of them)"
expect "and a total" contains "$out" "total"
expect "writes nothing" [ ! -e "$work/never" ]
# --help: defaults in the shortest form that reads back (not 2.0000000000000002e-05, 0.899999976).
run "sft --help" 0 "$bin" sft --help
expect "no float noise in the defaults" lacks "$out" "000000"
expect "lr as written" contains "$out" "(=2e-05)"
expect "beta1 as written" contains "$out" "(=0.9)"
# --backend auto (the default) plans for what would run here: without a visible GPU, the CPU,
# whether or not the CUDA backend is compiled in (the CI build has it).
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  run "--dry-run-memory with --backend auto on a machine without a GPU" 0 "$bin" sft --model tiny \
    --seq-len 64 --dry-run-memory
  expect "plans for the CPU" contains "$out" "cpu (fp32)"
  expect "without the CUDA context" lacks "$out" "CUDA context"
fi
run "sft --dry-run-memory with ZeRO-2" 0 "$bin" sft --model llama3-8b --seq-len 8192 --dry-run-memory \
  --dry-run-ranks 8 --backend cuda --shard-gradients
expect "two layer groups being computed" contains "$out" "gradients being computed (bf16, ZeRO-2: two layer groups)"
expect "1/8 of the reduced gradients" contains "$out" "reduced gradients (bf16, ZeRO-2: 1/8 of them)"
# The 70B model on 64 GPUs of 80 GB: ZeRO-3 must plan under 72 GiB per rank (docs/TRAINING.md).
run "70B with ZeRO-3 --dry-run-memory" 0 "$bin" sft --model llama3.1-70b --backend cuda --seq-len 8192 \
  --recompute --shard-gradients --shard-parameters --dry-run-memory --dry-run-ranks 64
expect "plans ZeRO-3" contains "$out" "ZeRO-3"
expect "1/64 of the weights, fp32 only" contains "$out" "master weights (fp32, ZeRO-3: 1/64, the only copy)"
total=$(printf '%s\n' "$out" | tail -1 | awk '$1 == "total" {print $2}')
expect "under 72 GiB ($total GiB)" awk -v t="$total" 'BEGIN { exit !(t > 0 && t < 72) }'
run "hybrid groups of 8 --dry-run-memory" 0 "$bin" sft --model llama3.1-70b --backend cuda --seq-len 8192 \
  --recompute --shard-parameters --shard-group-size 8 --dry-run-memory --dry-run-ranks 64
expect "1/8 of the weights" contains "$out" "master weights (fp32, ZeRO-3: 1/8, the only copy)"
run "reward --dry-run-memory from a checkpoint" 0 "$bin" reward --init "$work/ck" --dry-run-memory --recompute
expect "one block with --recompute" contains "$out" "block activations (one block: --recompute)"
expect "reward plans two rows per pair" contains "$out" "micro-batch 1 pairs = at most 2 rows x"
run "eval of the checkpoint" 0 "$bin" eval --init "$work/ck" --data "$work/train"
expect "one JSON line with the loss" contains "$out" '"loss":'
expect "and the perplexity" contains "$out" '"perplexity":'
run "eval on 2 ranks" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/ck" --data "$work/train"
loss=$(printf '%s\n' "$out" | grep -o '"loss":[^,}]*')
run "eval on 2 ranks with sharded parameters" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/ck" --data "$work/train" --shard-parameters
expect "the same loss ($loss)" contains "$out" "$loss"
run "generate from the checkpoint" 0 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --chat --max-new 8
run "resuming with another --lr is refused" 2 "$bin" sft --model tiny --data "$work/train" --val-data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --steps 8 --lr 2e-3 --ckpt-dir "$work/ck" --no-progress
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names the option" contains "$err" "--lr 0.002 (was 0.001)"
expect "option names as typed" contains "$err" "--min-lr 0.0002"
run "ckpt list" 0 "$bin" ckpt list "$work/ck"
expect "lists the steps" contains "$out" "step-00000006"
expect "marks latest" contains "$out" "latest"
run "ckpt verify" 0 "$bin" ckpt verify "$work/ck"
expect "says ok" contains "$out" "ok       step-00000006"
cp -r "$work/ck" "$work/ck-bad" && truncate -s 100 "$work/ck-bad/step-00000004/optim.h5"
run "ckpt verify finds a damaged checkpoint" 2 "$bin" ckpt verify "$work/ck-bad"
expect "names it" contains "$err" "damaged checkpoint(s): step-00000004"
run "ckpt verify of a missing directory" 2 "$bin" ckpt verify "$work/none"
run "ckpt without a directory" 2 "$bin" ckpt list
run "sft from a step directory" 0 "$bin" sft --init "$work/ck/step-00000006" --data "$work/train" --global-batch 2 --seq-len 64 --steps 1 --no-progress
run "--model must match the checkpoint" 2 "$bin" sft --init "$work/ck" --model llama3.2-1b --data "$work/train" --global-batch 2
expect "says so" contains "$err" "does not describe the model of"

# --- Hugging Face export and import: the same model, bit for bit in fp32 ---
run "export fp32" 0 "$bin" export --ckpt "$work/ck" --output "$work/hf32" --dtype fp32
expect "a causal LM" contains "$(cat "$work/hf32/config.json")" '"LlamaForCausalLM"'
expect "pad is <|finetune_right_pad_id|>" contains "$(cat "$work/hf32/config.json")" '"pad_token_id": 260'
expect "one safetensors file" [ -f "$work/hf32/model.safetensors" ]
expect "nothing partial left" [ ! -e "$work/hf32.partial" ]
expect "its special-token ids are its tokenizer files'" python3 "$(dirname "$0")/../support/export_special_ids.py" "$work/hf32" 256
# Llama 3's vocabulary trained on bytes data: the ids are still the bytes tokenizer's (256..511),
# not Llama 3's 128000.., or transformers would never stop at the end of a turn.
run "sft of tiny-llama3 on bytes data" 0 "$bin" sft --model tiny-llama3 --data "$work/train" --seq-len 32 --global-batch 2 --steps 1 --ckpt-dir "$work/tiny-ck" --no-progress
run "export it" 0 "$bin" export --ckpt "$work/tiny-ck" --output "$work/tiny-hf"
expect "its special-token ids are the bytes tokenizer's" python3 "$(dirname "$0")/../support/export_special_ids.py" "$work/tiny-hf" 256
rm -rf "$work/tiny-ck" "$work/tiny-hf"
run "eval of the checkpoint" 0 "$bin" eval --init "$work/ck" --data "$work/train" --seq-len 64
ck_eval=$out
run "eval of its export" 0 "$bin" eval --init "$work/hf32" --data "$work/train" --seq-len 64
expect "identical results" [ "$out" = "$ck_eval" ]
run "export refuses to overwrite" 2 "$bin" export --ckpt "$work/ck" --output "$work/hf32"
expect "says so" contains "$err" "exists"
run "export bf16, sharded" 0 "$bin" export --ckpt "$work/ck" --output "$work/hf16" --shard-size 100KB
expect "an index" [ -f "$work/hf16/model.safetensors.index.json" ]
expect "several shards" [ -f "$work/hf16/model-00002-of-00004.safetensors" ]
run "sft from the sharded export" 0 "$bin" sft --init "$work/hf16" --data "$work/train" --seq-len 64 --global-batch 2 --steps 1 --no-progress
run "generate from the export" 0 "$bin" generate --init "$work/hf32" --tokenizer bytes --prompt "Reverse word1." --max-new 4
# Log-probabilities of the new tokens, for comparing with another implementation (the GPU
# check's Hugging Face parity stage): the fp32 export gives the checkpoint's, bit for bit.
run "generate --logprobs from the checkpoint" 0 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --max-new 6 --json --logprobs
ck_generated=$out
run "generate --logprobs from the export" 0 "$bin" generate --init "$work/hf32" --tokenizer bytes --prompt "Reverse word1." --max-new 6 --json --logprobs
expect "ids and log-probabilities, the same from both" python3 -c '
import json, sys
a, b = (json.loads(t) for t in sys.argv[1:3])
assert a["new_tokens"] == len(a["new_ids"]) == len(a["logprobs"]) > 0, a
assert a["prompt_tokens"] == len(a["prompt_ids"]), a
assert all(-1e9 < p <= 0 for p in a["logprobs"]), a
for k in ("prompt_ids", "new_ids", "logprobs"):
    assert a[k] == b[k], (k, a[k], b[k])' "$ck_generated" "$out"
run "--logprobs needs --json" 2 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --logprobs
# Tempered log-probabilities (GRPO's): of softmax(logits / T), the same draws.
run "generate --logprobs at T 0.7" 0 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --max-new 6 --json --logprobs --temperature 0.7 --seed 3
raw_generated=$out
run "generate --tempered-logprobs" 0 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --max-new 6 --json --logprobs --tempered-logprobs --temperature 0.7 --seed 3
expect "the same tokens, other log-probabilities, each <= 0" python3 -c '
import json, sys
a, b = (json.loads(t) for t in sys.argv[1:3])
assert a["new_ids"] == b["new_ids"] and a["prompt_ids"] == b["prompt_ids"], (a, b)
assert a["logprobs"] != b["logprobs"] and a["prompt_logprobs"] != b["prompt_logprobs"], (a, b)
assert all(p <= 0 for p in b["logprobs"] + b["prompt_logprobs"]), b' "$raw_generated" "$out"
run "--tempered-logprobs needs --logprobs" 2 "$bin" generate --init "$work/ck" --prompt "x" --json --tempered-logprobs --temperature 0.7
run "--tempered-logprobs needs a temperature" 2 "$bin" generate --init "$work/ck" --prompt "x" --json --logprobs --tempered-logprobs
expect "says so" contains "$err" "--temperature T > 0"
run "export --dtype fp16 is refused" 2 "$bin" export --ckpt "$work/ck" --output "$work/hf-x" --dtype fp16
run "export --shard-size nonsense" 2 "$bin" export --ckpt "$work/ck" --output "$work/hf-x" --shard-size 5XB
cp -r "$work/hf32" "$work/hf-cut" && truncate -s 5000 "$work/hf-cut/model.safetensors"
run "a truncated safetensors file" 2 "$bin" eval --init "$work/hf-cut" --data "$work/train"
expect "names the file and why" contains "$err" "hf-cut/model.safetensors: tensor"
expect "one error line" [ "$(error_lines "$err")" = 1 ]

# --- a LoRA adapter in PEFT's format (written here as PEFT's save_pretrained writes one): eval,
# generate and score fold it into the --init model; B = 0 changes nothing, bit for bit ---
write_adapter() {  # DIR R B_VALUE [TASK]: adapters on q_proj and v_proj of the tiny model
  python3 - "$@" <<'PY'
import json, os, struct, sys
out, r, b, task = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), (sys.argv[4:] or ["CAUSAL_LM"])[0]
hidden, kv, layers = 64, 32, 2
tensors = []
for l in range(layers):
    for module, width in (("q_proj", hidden), ("v_proj", kv)):
        p = f"base_model.model.model.layers.{l}.self_attn.{module}."
        tensors.append((p + "lora_A.weight", [r, hidden], [((i * 37) % 17 - 8) / 64 for i in range(r * hidden)]))
        tensors.append((p + "lora_B.weight", [width, r], [b] * (width * r)))
if task == "SEQ_CLS":
    tensors.append(("base_model.model.score.weight", [1, hidden], [0.01 * (i % 5) for i in range(hidden)]))
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name, shape, values in tensors:
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * len(values)]}
    offset += 4 * len(values)
text = json.dumps(header).encode()
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for _, _, values in tensors:
        f.write(struct.pack(f"<{len(values)}f", *values))
config = {"peft_type": "LORA", "task_type": task, "r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
          "target_modules": ["q_proj", "v_proj"], "bias": "none", "inference_mode": True}
if task == "SEQ_CLS":
    config["modules_to_save"] = ["classifier", "score"]
with open(os.path.join(out, "adapter_config.json"), "w") as f:
    json.dump(config, f)
PY
}
write_adapter "$work/lora-zero" 4 0.0
write_adapter "$work/lora" 4 0.05
write_adapter "$work/lora-r2" 2 0.05
write_adapter "$work/lora-rm" 4 0.05 SEQ_CLS
run "eval with a zero adapter" 0 "$bin" eval --init "$work/ck" --data "$work/train" --seq-len 64 --adapter "$work/lora-zero"
expect "the model's own results" [ "$out" = "$ck_eval" ]
run "eval with an adapter" 0 "$bin" eval --init "$work/ck" --data "$work/train" --seq-len 64 --adapter "$work/lora"
expect "other results" [ "$out" != "$ck_eval" ]
expect "says which adapter" contains "$err" "with the adapter $work/lora"
run "generate with an adapter" 0 "$bin" generate --init "$work/ck" --prompt "Reverse word1." --max-new 4 --adapter "$work/lora"
run "eval with a SEQ_CLS adapter is a reward model" 2 "$bin" eval --init "$work/ck" --data "$work/train" --adapter "$work/lora-rm"
expect "of preference data" contains "$err" "preference"
run "an adapter of another rank" 2 "$bin" eval --init "$work/ck" --data "$work/train" --adapter "$work/lora-r2"
expect "names the file and the tensor" contains "$err" "lora-r2/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'"
expect "and the shapes" contains "$err" "has shape [2, 64], expected [4, 64]"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
run "score with a language model's adapter" 2 "$bin" score --init "$work/ck" --prompt "a" --response "b" --adapter "$work/lora"
expect "says which task it needs" contains "$err" "needs a SEQ_CLS adapter (reward model)"
run "score with a SEQ_CLS adapter on the SFT checkpoint" 0 "$bin" score --init "$work/ck" --prompt "Reverse abc." --response "cba" --json --adapter "$work/lora-rm"
run "the same on 2 ranks" 0 "$mpiexec" -n 2 "$bin" score --init "$work/ck" --prompt "Reverse abc." --response "cba" --json --adapter "$work/lora-rm"
seq_cls_score=$out
expect "a reward" contains "$out" '"reward":'
run "--adapter on 2 ranks" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/ck" --data "$work/train" --adapter "$work/lora"
adapted2=$out
run "--adapter with --shard-parameters" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/ck" --data "$work/train" --adapter "$work/lora" --shard-parameters
expect "folded into each rank's share: the same loss" [ "$out" = "$adapted2" ]
run "a SEQ_CLS adapter with --shard-parameters" 0 "$mpiexec" -n 2 "$bin" score --init "$work/ck" --prompt "Reverse abc." --response "cba" --json --adapter "$work/lora-rm" --shard-parameters
expect "the reward of the whole model" [ "$out" = "$seq_cls_score" ]
run "a bad adapter with --shard-parameters" 2 "$mpiexec" -n 2 "$bin" eval --init "$work/ck" --data "$work/train" --adapter "$work/lora-r2" --shard-parameters
expect "one line naming the tensor" [ "$(error_lines "$err")" = 1 ]
run "a missing adapter" 2 "$bin" generate --init "$work/ck" --prompt "x" --adapter "$work/none"
expect "names its config" contains "$err" "none/adapter_config.json"

# --- LoRA training on the frozen checkpoint: checkpointed and resumed; its checkpoint read as a
# model (the base merged with the adapters), exported merged or as a PEFT adapter, restarted ---
lora_common=(sft --init "$work/ck" --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1
  --lora-targets "q,v" --lora-dropout 0.1 --ckpt-dir "$work/lora-ck" --no-progress)
lora_run=("${lora_common[@]}" --lora-rank 4)
run "sft --lora-rank without --init" 2 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --lora-rank 4 --steps 1
expect "says what is missing" contains "$err" "--lora-rank needs the model to adapt: --init CKPT|HF_DIR"
run "sft --lora-rank" 0 "$bin" "${lora_run[@]}" --steps 3
expect "says what trains" contains "$err" "trained: LoRA adapters of rank 4 on q,v"
expect "a small checkpoint" [ "$(stat -c %s "$work/lora-ck/step-00000003/model.h5")" -lt 200000 ]
run "resumed for one more step" 0 "$bin" "${lora_run[@]}" --steps 4
expect "from step 3" contains "$err" "resumed at step 3"
run "ckpt verify of a LoRA checkpoint" 0 "$bin" ckpt verify "$work/lora-ck"
run "resumed with another rank" 2 "$bin" "${lora_common[@]}" --steps 5 --lora-rank 8
expect "says which adapters it holds" contains "$err" "holds LoRA adapters of rank 4 on q,v"
run "eval of a LoRA checkpoint" 0 "$bin" eval --init "$work/lora-ck" --data "$work/train" --seq-len 64
lora_eval=$out
expect "a loss" contains "$lora_eval" '"loss":'
run "generate from a LoRA checkpoint" 0 "$bin" generate --init "$work/lora-ck" --prompt "Reverse word1." --max-new 4
run "export of a LoRA checkpoint without --merge or --adapter" 2 "$bin" export --ckpt "$work/lora-ck" --output "$work/lora-x"
expect "says what to give" contains "$err" "give --merge to write that model with the adapters folded in, or --adapter"
expect "nothing written" [ ! -e "$work/lora-x" ]
run "export --merge --adapter" 2 "$bin" export --ckpt "$work/lora-ck" --merge --adapter --output "$work/lora-x"
run "export --merge of a whole model" 2 "$bin" export --ckpt "$work/ck" --merge --output "$work/lora-x"
expect "says why" contains "$err" "--merge: not a LoRA checkpoint"
run "export --merge" 0 "$bin" export --ckpt "$work/lora-ck" --merge --dtype fp32 --output "$work/lora-merged"
expect "says into what" contains "$out" "merged into $work/ck/step-00000006 as LlamaForCausalLM"
expect "config.json records the merge" contains "$(cat "$work/lora-merged/config.json")" '"merged_lora"'
run "eval of the merged export" 0 "$bin" eval --init "$work/lora-merged" --data "$work/train" --seq-len 64
expect "the checkpoint's loss, bit for bit" [ "$out" = "$lora_eval" ]
run "export --adapter" 0 "$bin" export --ckpt "$work/lora-ck" --adapter --output "$work/lora-peft"
expect "fp32 by default" contains "$out" "fp32 tensors for the base model $work/ck/step-00000006"
expect "PEFT's two files" [ -f "$work/lora-peft/adapter_config.json" -a -f "$work/lora-peft/adapter_model.safetensors" ]
expect "the dropout trained with" contains "$(cat "$work/lora-peft/adapter_config.json")" '"lora_dropout": 0.1'
run "eval of the base with the exported adapter" 0 "$bin" eval --init "$work/ck" --data "$work/train" --seq-len 64 --adapter "$work/lora-peft"
expect "the checkpoint's loss, bit for bit" [ "$out" = "$lora_eval" ]
run "sft --init-adapter" 0 "$bin" sft --init "$work/ck" --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 \
  --init-adapter "$work/lora-peft" --steps 1 --ckpt-dir "$work/lora-ck2" --no-progress
expect "says where the adapters start" contains "$err" "LoRA: the adapters start from $work/lora-peft"
expect "takes the adapter's rank and targets" contains "$err" "trained: LoRA adapters of rank 4 on q,v"
run "--init-adapter with another --lora-rank" 2 "$bin" sft --init "$work/ck" --data "$work/train" --seq-len 64 --global-batch 4 \
  --init-adapter "$work/lora-peft" --lora-rank 8 --steps 1
expect "names the disagreement" contains "$err" "--lora-rank disagrees with --init-adapter $work/lora-peft, whose adapters have r=4"
run "--init-adapter with a tensor of another rank" 2 "$bin" sft --init "$work/ck" --data "$work/train" --seq-len 64 --global-batch 4 \
  --init-adapter "$work/lora-r2" --steps 1
expect "names the file and the tensor" contains "$err" "lora-r2/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'"
run "reward --init-adapter with a language model's adapter" 2 "$bin" reward --init "$work/ck" --data "$work/pref" --global-batch 1 \
  --init-adapter "$work/lora-peft" --steps 1
expect "names the adapter's config" contains "$err" "lora-peft/adapter_config.json: a CAUSAL_LM adapter (language model) cannot start a reward run"
run "eval of a LoRA checkpoint on 2 ranks" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/lora-ck" --data "$work/train" --seq-len 64
lora_eval2=$out
run "the same with its base sharded" 0 "$mpiexec" -n 2 "$bin" eval --init "$work/lora-ck" --data "$work/train" --seq-len 64 --shard-parameters
expect "the same loss" [ "$out" = "$lora_eval2" ]
cp -r "$work/lora-ck" "$work/lora-other-base"
sed -i "s|$work/ck/step-00000006|$work/ck/step-00000004|" "$work/lora-other-base/step-00000004/manifest.json"
run "a LoRA checkpoint whose base is another model" 2 "$bin" eval --init "$work/lora-other-base" --data "$work/train"
expect "says so" contains "$err" "is not the one these adapters were trained on"
lora_sharded=(sft --init "$work/ck" --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1
  --lora-rank 4 --steps 2 --no-progress --shard-parameters)
run "--lora-rank with --shard-parameters on 2 ranks" 0 "$mpiexec" -n 2 "$bin" "${lora_sharded[@]}" --ckpt-dir "$work/lora-sharded"
expect "says what is sharded" contains "$err" "the frozen model sharded (1/2 on each rank)"
run "--lora-rank with --shard-group-size" 2 "$mpiexec" -n 2 "$bin" "${lora_sharded[@]}" --shard-group-size 1
expect "not built" contains "$err" "LoRA shards its frozen model over all ranks"
run "sft --lora-rank --dry-run-memory" 0 "$bin" sft --model llama3.1-8b --backend cuda --seq-len 8192 \
  --recompute --lora-rank 16 --dry-run-memory --dry-run-ranks 8
expect "the weights frozen" contains "$out" "weights (bf16, 8.030B parameters, frozen)"
expect "the adapters" contains "$out" "LoRA adapters (bf16, rank 16: 41.94M parameters)"
run "70B with LoRA and its frozen model sharded: planned" 0 "$bin" sft --model llama3.1-70b --backend cuda --seq-len 8192 \
  --recompute --lora-rank 16 --shard-parameters --dry-run-memory --dry-run-ranks 8
expect "the frozen weights sharded" contains "$out" "weights (bf16, 70.554B parameters, frozen, sharded: 1/8)"

# --- restart guard rails: never start over silently where checkpoints are ---
sft_ck=(sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --lr 1e-3 --no-progress)
run "--resume none into a directory with checkpoints" 2 "$bin" "${sft_ck[@]}" --steps 8 --ckpt-dir "$work/ck" --resume none
expect "says why" contains "$err" "holds checkpoints of an earlier run (newest step-00000006)"
run "--resume CKPT needs --ckpt-dir" 2 "$bin" "${sft_ck[@]}" --steps 8 --resume "$work/ck"
expect "says so" contains "$err" "--resume CKPT needs --ckpt-dir"
run "--deadline needs --ckpt-dir" 2 "$bin" "${sft_ck[@]}" --steps 8 --deadline 600
cp -r "$work/ck" "$work/ck-all-bad"
truncate -s 100 "$work/ck-all-bad/step-00000004/optim.h5" "$work/ck-all-bad/step-00000006/model.h5"
run "every checkpoint damaged: refused" 2 "$bin" "${sft_ck[@]}" --steps 8 --ckpt-dir "$work/ck-all-bad"
expect "says what happened" contains "$err" "no good checkpoint to resume from"
expect "set aside" [ -d "$work/ck-all-bad/step-00000006.damaged" ]
run "and refused again on the rerun" 2 "$bin" "${sft_ck[@]}" --steps 8 --ckpt-dir "$work/ck-all-bad"
expect "names the damaged one" contains "$err" "only damaged ones set aside (newest step-00000006.damaged"
run "--resume none then starts over" 0 "$bin" "${sft_ck[@]}" --steps 1 --ckpt-dir "$work/ck-all-bad" --resume none
mkdir -p "$work/ck-no-manifest" && cp -r "$work/ck/step-00000006" "$work/ck-no-manifest/" && rm "$work/ck-no-manifest/step-00000006/manifest.json"
run "ckpt verify: a step without its manifest" 2 "$bin" ckpt verify "$work/ck-no-manifest"
expect "is damaged" contains "$out" "DAMAGED  step-00000006: no manifest.json"
run "ckpt verify of that step directory" 2 "$bin" ckpt verify "$work/ck-no-manifest/step-00000006"
expect "says the same" contains "$out" "DAMAGED  step-00000006"
# The node-local level's options: one-line usage errors.
local_run=(sft --model tiny --data "$work/train" --seq-len 64 --global-batch 4 --micro-batch 1 --steps 2 --no-progress)
run "--ckpt-local without --ckpt-dir" 2 "$bin" "${local_run[@]}" --ckpt-local "$work/loc" --checkpoint-every-local 1
expect "says it needs --ckpt-dir" contains "$err" "--ckpt-local needs --ckpt-dir"
run "--ckpt-local without --checkpoint-every-local" 2 "$bin" "${local_run[@]}" --ckpt-dir "$work/ck-loc" --ckpt-local "$work/loc"
expect "says they go together" contains "$err" "go together"
run "--ckpt-redundancy of an unknown kind" 2 "$bin" "${local_run[@]}" --ckpt-dir "$work/ck-loc" --ckpt-local "$work/loc" --checkpoint-every-local 1 --ckpt-redundancy raid6
expect "names the option" contains "$err" "--ckpt-redundancy must be partner, xor or none"
: >"$work/not-a-dir"
run "--ckpt-local under a file" 2 "$bin" "${local_run[@]}" --ckpt-dir "$work/ck-loc" --ckpt-local "$work/not-a-dir/%h" --checkpoint-every-local 1
expect "names the option" contains "$err" "--ckpt-local"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
run "a run with the node-local level on one node" 0 "$bin" "${local_run[@]}" --ckpt-dir "$work/ck-loc" --ckpt-local "$work/loc/%h" --checkpoint-every-local 1
expect "warns that partner copies need another node" contains "$err" "single node"
run "ckpt list --ckpt-local" 0 "$bin" ckpt list "$work/ck-loc" --ckpt-local "$work/loc/%h"
expect "lists the node-local step 1" contains "$out" "step 1: every one of the 1 ranks' states can be had"
cp -r "$work/ck" "$work/ck-prune" && mkdir "$work/ck-prune/step-00000008.partial"
run "ckpt prune --keep-last 1 is refused" 2 "$bin" ckpt prune "$work/ck-prune" --keep-last 1
run "ckpt prune" 0 "$bin" ckpt prune "$work/ck-prune" --keep-last 2
expect "leaves a directory being written" [ -d "$work/ck-prune/step-00000008.partial" ]
cp -r "$work/ck" "$work/ck-flip"
file="$work/ck-flip/step-00000006/model.h5"
off=$(($(stat -c %s "$file") - 100))
byte=$(od -An -tu1 -j "$off" -N1 "$file" | tr -d ' ')
printf '%b' "\\x$(printf %02x $((byte ^ 1)))" | dd of="$file" bs=1 seek="$off" conv=notrunc status=none
run "--init from a damaged checkpoint" 2 "$bin" sft --init "$work/ck-flip" --data "$work/train" --global-batch 2 --seq-len 64 --steps 1 --no-progress
expect "names the tensor" contains "$err" "checksum mismatch"

# --- generate and score: the model comes from a checkpoint; errors before any work ---
run "generate needs --init" 2 "$bin" generate --prompt hi
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names --init" contains "$err" "--init CKPT is required"
run "generate on a missing checkpoint" 2 "$bin" generate --init "$work/nonexistent" --prompt hi
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "names the path" contains "$err" "error: $work/nonexistent: no such checkpoint"
run "--init and --ckpt are one option" 2 "$bin" generate --init "$work" --ckpt "$work" --prompt hi
mkdir -p "$work/not-a-ckpt"
run "score on a directory that is not a checkpoint" 2 "$bin" score --init "$work/not-a-ckpt" --prompt q --response a
expect "one error line" [ "$(lines "$err")" = 1 ]
expect "says so" contains "$err" "error: $work/not-a-ckpt: not a checkpoint"
mkdir -p "$work/hf-model" && echo '{"architectures":["GPT2LMHeadModel"]}' >"$work/hf-model/config.json" && : >"$work/hf-model/model.safetensors"
run "a Hugging Face model of another architecture" 2 "$bin" generate --init "$work/hf-model" --prompt hi
expect "says which are supported" contains "$err" "only LlamaForCausalLM and LlamaForSequenceClassification"
run "score needs a prompt and response or an input" 2 "$bin" score --init "$work/not-a-ckpt" --prompt q
expect "says what to give" contains "$err" "give --prompt TEXT --response TEXT, or --input FILE.jsonl"
run "a bad temperature is refused before loading" 2 "$bin" generate --init "$work/nonexistent" --prompt hi --temperature -1
expect "names the option" contains "$err" "--temperature -1: must be a finite number >= 0"
run "generate on 2 ranks: rank 0 reports the missing checkpoint" 2 "$mpiexec" -n 2 "$bin" generate --init "$work/nonexistent" --prompt hi
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names the path" contains "$err" "$work/nonexistent: no such checkpoint"
run "generate help" 0 "$bin" generate --help
expect "shows sampling options" contains "$out" "--top-p"

finish_cli_checks "CLI checks"
