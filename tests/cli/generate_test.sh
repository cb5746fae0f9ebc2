#!/usr/bin/env bash
# `generate --input` as a batch job on the tiny model (a checkpoint of a few SFT steps on the
# bytes tokenizer): the output's format and order, its errors, ranks and batch sizes, and a job
# stopped (exit 75) and continued.
#   generate_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec [format|ranks|resume]
# Without a group: all three.
set -uo pipefail
bin=${1:?usage: generate_test.sh LLAMA3_HPC MPIEXEC [format|ranks|resume]}
mpiexec=${2:?usage: generate_test.sh LLAMA3_HPC MPIEXEC [format|ranks|resume]}
group=${3:-all}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"

# --- a model: the tiny preset after 2 SFT steps ---
for i in $(seq 1 16); do
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "word$i" "$(echo "word$i" | rev)"
done >"$work/train.jsonl"
run "prep training data" 0 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/train"
run "a tiny checkpoint" 0 "$bin" sft --model tiny --data "$work/train" --seq-len 64 --global-batch 2 \
  --steps 2 --lr 1e-3 --ckpt-dir "$work/ck" --no-progress
gen=("$bin" generate --init "$work/ck")

# prompts N FILE: N records, a blank line after the second, carried fields, every third one a
# conversation.
prompts() {
  local i
  for i in $(seq 1 "$1"); do
    if ((i % 3 == 0)); then
      printf '{"id":%d,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Reverse word%d."}],"tags":["m",%d]}\n' "$i" "$i" "$i"
    else
      printf '{"prompt":"Reverse word%d.","id":%d,"meta":{"k":"v%d"}}\n' "$i" "$i" "$i"
    fi
    if ((i == 2)); then echo; fi
  done >"$2"
}

# nothing_left NAME OUTPUT: no output, no temporary file, no progress file.
nothing_left() {
  expect "$1: no output" [ ! -e "$2" ]
  expect "$1: no temporary file" [ ! -e "$2.partial" ]
  expect "$1: no progress file" [ ! -e "$2.progress" ]
}

# check_format FILE INPUT SAMPLES LOGPROBS: the lines in input order, their keys, carried fields.
check_format() {
  python3 - "$@" <<'PY'
import json, sys
path, source, samples, logprobs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
records = [(n, json.loads(t)) for n, t in enumerate(open(source), 1) if t.strip()]
lines = [json.loads(t) for t in open(path, encoding="utf-8")]
assert len(lines) == len(records) * samples, (len(lines), len(records), samples)
keys = ["line", "sample", "completion", "ids", "stopped"] + (["logprobs", "prompt_ids"] if logprobs else [])
for i, line in enumerate(lines):
    number, record = records[i // samples]
    assert line["line"] == number and line["sample"] == i % samples, (i, line["line"], line["sample"])
    carried = [k for k in record if k not in ("prompt", "messages")]
    assert list(line) == keys + carried, list(line)
    for k in carried:
        assert line[k] == record[k], k
    assert isinstance(line["completion"], str) and isinstance(line["stopped"], bool)
    assert all(0 <= t < 512 for t in line["ids"])
    if logprobs:
        assert len(line["logprobs"]) == len(line["ids"]), i
        assert all(p <= 0 for p in line["logprobs"])
        assert line["prompt_ids"][0] == 256  # <|begin_of_text|> of the bytes tokenizer
PY
}

if [[ $group == all || $group == format ]]; then
  prompts 5 "$work/p.jsonl"
  run "generate --input, 2 samples" 0 "${gen[@]}" --input "$work/p.jsonl" --output "$work/out2.jsonl" \
    --num-samples 2 --max-new 16 --temperature 0.8 --seed 3
  expect "input order, line numbers, keys, carried fields" check_format "$work/out2.jsonl" "$work/p.jsonl" 2 0
  expect "no progress file left" [ ! -e "$work/out2.jsonl.progress" ]
  expect "no temporary file left" [ ! -e "$work/out2.jsonl.partial" ]
  expect "a summary in the log" contains "$err" "generated 10 completions of 5 records"
  gzip -c "$work/p.jsonl" >"$work/p.jsonl.gz"
  run "4 samples with --logprobs, from .gz" 0 "${gen[@]}" --input "$work/p.jsonl.gz" \
    --output "$work/out4.jsonl" --num-samples 4 --max-new 16 --temperature 0.8 --seed 3 --logprobs
  expect "4 lines per record, logprobs per id, prompt_ids" check_format "$work/out4.jsonl" "$work/p.jsonl" 4 1
  expect "the first two samples are the 2-sample run's" python3 -c '
import json, sys
a = [json.loads(t) for t in open(sys.argv[1])]
b = [json.loads(t) for t in open(sys.argv[2])]
b = [l for l in b if l["sample"] < 2]
for x, y in zip(a, b):
    assert (x["line"], x["sample"], x["ids"], x["completion"]) == (y["line"], y["sample"], y["ids"], y["completion"])
assert len(a) == len(b)' "$work/out2.jsonl" "$work/out4.jsonl"

  # A LoRA checkpoint is generated from with its adapters folded in, whether read as itself or
  # as its base with the exported PEFT adapter (--adapter): the same file.
  run "a LoRA checkpoint" 0 "$bin" sft --init "$work/ck" --data "$work/train" --seq-len 64 \
    --global-batch 2 --steps 1 --lr 1e-2 --lora-rank 4 --ckpt-dir "$work/lora" --no-progress
  run "its PEFT adapter" 0 "$bin" export --init "$work/lora" --adapter --output "$work/peft"
  run "generate from the LoRA checkpoint" 0 "$bin" generate --init "$work/lora" --input "$work/p.jsonl" \
    --output "$work/lora1.jsonl" --num-samples 2 --max-new 16 --temperature 0.8 --seed 3
  run "generate from its base with --adapter" 0 "${gen[@]}" --adapter "$work/peft" --input "$work/p.jsonl" \
    --output "$work/lora2.jsonl" --num-samples 2 --max-new 16 --temperature 0.8 --seed 3
  expect "the same completions with the adapter either way" cmp -s "$work/lora1.jsonl" "$work/lora2.jsonl"
  # shellcheck disable=SC2016 # the arguments expand in the inner shell
  expect "the adapter changes the completions" bash -c '! cmp -s "$0" "$1"' "$work/lora1.jsonl" "$work/out2.jsonl"

  # A stop string: two letters generated one after the other; the rerun ends there.
  stop=$(python3 -c '
import json, sys
for t in open(sys.argv[1]):
    ids = json.loads(t)["ids"]
    for j in range(1, len(ids) - 2):
        if all(0x61 <= c <= 0x7a for c in ids[j:j + 2]):
            print(bytes(ids[j:j + 2]).decode()); sys.exit()' "$work/out2.jsonl")
  expect "found a stop string to try ($stop)" [ -n "$stop" ]
  run "--stop" 0 "${gen[@]}" --input "$work/p.jsonl" --output "$work/stop.jsonl" \
    --num-samples 2 --max-new 16 --temperature 0.8 --seed 3 --stop "$stop" --stop "never-there"
  expect "cut before the stop string, ids through it, stopped" python3 -c '
import json, sys
stop = sys.argv[3]
a = [json.loads(t) for t in open(sys.argv[1])]
b = [json.loads(t) for t in open(sys.argv[2])]
cut = 0
for x, y in zip(a, b):
    if stop not in x["completion"]:
        assert y == x, (x, y)
        continue
    cut += 1
    assert y["stopped"] is True and 0 < len(y["ids"]) <= len(x["ids"]), y
    assert y["ids"] == x["ids"][:len(y["ids"])], (x["ids"], y["ids"])
    assert stop not in y["completion"] and x["completion"].startswith(y["completion"]), y
    assert x["completion"].find(stop) == len(y["completion"]), (x["completion"], y["completion"])
assert cut >= 1 and len(a) == len(b)' "$work/out2.jsonl" "$work/stop.jsonl" "$stop"

  run "an output replaced whole" 0 "${gen[@]}" --input "$work/p.jsonl" --output "$work/out2.jsonl" \
    --num-samples 2 --max-new 16 --temperature 0.8 --seed 3
  expect "the same lines" check_format "$work/out2.jsonl" "$work/p.jsonl" 2 0
  run "--dry-run-memory" 0 "${gen[@]}" --input "$work/p.jsonl" --dry-run-memory --batch-size 8 --max-new 100
  expect "plans the KV cache" contains "$out" "KV cache (8 sequences x"
  expect "total last" contains "$(printf '%s\n' "$out" | tail -1)" "total"
  run "interactive generate still works" 0 "${gen[@]}" --prompt "Reverse word1." --chat --max-new 4 --json
  expect "one JSON line" contains "$out" '"new_tokens":'

  # --- errors: one line, file:line where there is one, exit 2, nothing left behind ---
  bad() {  # bad NAME LINE-TEXT EXPECTED-MESSAGE
    { echo '{"prompt":"fine"}'; echo; printf '%s\n' "$2"; echo '{"prompt":"fine too"}'; } >"$work/bad.jsonl"
    run "$1" 2 "${gen[@]}" --input "$work/bad.jsonl" --output "$work/bad-out.jsonl" --num-samples 2
    expect "$1: one error line" [ "$(error_lines "$err")" = 1 ]
    expect "$1: file:line and why" contains "$err" "bad.jsonl:3: $3"
    nothing_left "$1" "$work/bad-out.jsonl"
  }
  bad "not JSON" '{"prompt": "x"' "not valid JSON"
  bad "neither prompt nor messages" '{"text": "x"}' 'expected "prompt"'
  bad "both prompt and messages" '{"prompt": "x", "messages": []}' 'give "prompt" or "messages", not both'
  bad "a prompt of the wrong type" '{"prompt": 5}' '"prompt" must be a string'
  bad "messages of the wrong type" '{"messages": "x"}' '"messages" must be a non-empty list'
  bad "messages ending with the answer" '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}' '"messages" must end before the assistant'
  bad "a field named as an output key" '{"prompt": "x", "ids": [1]}' 'the field "ids"'
  bad "not an object" '[1, 2]' 'a record must be a JSON object'
  { echo '{"prompt":"fine"}'; printf '{"prompt":"%s"}\n' "$(printf 'x%.0s' $(seq 1 40))"; } >"$work/long.jsonl"
  run "a prompt longer than the context" 2 "${gen[@]}" --input "$work/long.jsonl" --output "$work/bad-out.jsonl" --max-new 2000
  expect "names long.jsonl:2" contains "$err" "long.jsonl:2: the prompt has"
  nothing_left "a long prompt" "$work/bad-out.jsonl"
  { echo '{"prompt":"a"}'; echo '{"prompt":"b"}'; echo '{"prompt":"c"}'; echo 'oops'; echo '{"prompt":"e"}'; echo '{"text":"f"}'; } >"$work/bad2.jsonl"
  run "the first bad record on 2 ranks" 2 "$mpiexec" -n 2 "${gen[@]}" --input "$work/bad2.jsonl" --output "$work/bad-out.jsonl"
  expect "one error line" [ "$(error_lines "$err")" = 1 ]
  expect "names line 4" contains "$err" "bad2.jsonl:4:"
  nothing_left "2 ranks" "$work/bad-out.jsonl"
  run "--num-samples 0" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/bad-out.jsonl" --num-samples 0
  expect "says at least 1" contains "$err" "--num-samples must be at least 1"
  run "a --batch-size that cannot fit" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/bad-out.jsonl" --batch-size 16000000
  expect "one error line" [ "$(error_lines "$err")" = 1 ]
  expect "says what fits" contains "$err" "fit"
  nothing_left "--batch-size" "$work/bad-out.jsonl"
  run "a stop string that is not UTF-8" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/bad-out.jsonl" --stop $'\xff'
  expect "says UTF-8" contains "$err" "UTF-8"
  run "--input without --output" 2 "${gen[@]}" --input "$work/p.jsonl"
  run "--input and --prompt" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/bad-out.jsonl" --prompt x
  run "--stop without --input" 2 "${gen[@]}" --prompt x --stop y
  run "--chat with --input" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/bad-out.jsonl" --chat
  run "a missing input" 2 "${gen[@]}" --input "$work/none.jsonl" --output "$work/bad-out.jsonl"
  run "--output that is the input" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/p.jsonl"
  run "--output in a missing directory" 2 "${gen[@]}" --input "$work/p.jsonl" --output "$work/no/out.jsonl"
  nothing_left "every refusal" "$work/bad-out.jsonl"
fi

common=(--max-new 24 --temperature 0.9 --top-p 0.95 --seed 11 --logprobs)

if [[ $group == all || $group == ranks ]]; then
  prompts 7 "$work/r.jsonl"
  four=("${common[@]}" --num-samples 4)
  run "1 rank, the default batch" 0 "${gen[@]}" --input "$work/r.jsonl" --output "$work/r1.jsonl" "${four[@]}"
  expect "format" check_format "$work/r1.jsonl" "$work/r.jsonl" 4 1
  run "1 rank, --batch-size 3" 0 "${gen[@]}" --input "$work/r.jsonl" --output "$work/r1b3.jsonl" "${four[@]}" --batch-size 3
  expect "the same file as the default batch" cmp "$work/r1.jsonl" "$work/r1b3.jsonl"
  run "2 ranks" 0 "$mpiexec" -n 2 "${gen[@]}" --input "$work/r.jsonl" --output "$work/r2.jsonl" "${four[@]}"
  expect "the same file as 1 rank" cmp "$work/r1.jsonl" "$work/r2.jsonl"
  run "2 ranks, --batch-size 1" 0 "$mpiexec" -n 2 "${gen[@]}" --input "$work/r.jsonl" --output "$work/r2b1.jsonl" "${four[@]}" --batch-size 1
  expect "the same file" cmp "$work/r1.jsonl" "$work/r2b1.jsonl"
  run "2 ranks, --shard-parameters" 0 "$mpiexec" -n 2 "${gen[@]}" --input "$work/r.jsonl" --output "$work/r2s.jsonl" "${four[@]}" --shard-parameters --batch-size 2
  expect "the same file" cmp "$work/r1.jsonl" "$work/r2s.jsonl"
fi

if [[ $group == all || $group == resume ]]; then
  prompts 12 "$work/s.jsonl"
  job=(--input "$work/s.jsonl" "${common[@]}" --num-samples 2)
  run "the uninterrupted reference" 0 "${gen[@]}" "${job[@]}" --output "$work/ref.jsonl"
  # 2 ranks, batch 1, 2 samples: rounds of 4 records; rank 1 gets SIGUSR1 as round 2 starts.
  out_s=(--output "$work/s.out.jsonl")
  L3_FAULT="generate.round@1#2=raise:USR1" run "SIGUSR1 on rank 1" 75 "$mpiexec" -n 2 "${gen[@]}" "${job[@]}" "${out_s[@]}" --batch-size 1
  expect "says how to continue" contains "$out" "stopped by a signal to another rank after 4 of 12 records"
  expect "a progress file" [ -f "$work/s.out.jsonl.progress" ]
  expect "no output yet" [ ! -e "$work/s.out.jsonl" ]
  expect "the progress counts 4 records" contains "$(cat "$work/s.out.jsonl.progress")" '"records":4'
  run "another --top-k is refused" 2 "$mpiexec" -n 2 "${gen[@]}" "${job[@]}" "${out_s[@]}" --top-k 50
  expect "says what changed" contains "$err" "changed since the interrupted run"
  expect "the progress kept" [ -f "$work/s.out.jsonl.progress" ]
  # 1 rank, batch 2: rounds of 4 records, the second one stopped by SIGTERM.
  L3_FAULT="generate.round@0#2=raise:TERM" run "SIGTERM, 1 rank, another batch size" 75 "${gen[@]}" "${job[@]}" "${out_s[@]}" --batch-size 2
  expect "8 done" contains "$out" "stopped by SIGTERM after 8 of 12 records"
  run "continued on 2 ranks to the end" 0 "$mpiexec" -n 2 "${gen[@]}" "${job[@]}" "${out_s[@]}"
  expect "the uninterrupted run's file" cmp "$work/ref.jsonl" "$work/s.out.jsonl"
  expect "the progress file removed" [ ! -e "$work/s.out.jsonl.progress" ]
  expect "the temporary file renamed" [ ! -e "$work/s.out.jsonl.partial" ]
  # --deadline 2: the job held up 3 s (a fault point sleeps) as its first round starts.
  L3_FAULT="generate.round@*#1=sleep:3" run "--deadline" 75 "${gen[@]}" "${job[@]}" --output "$work/d.jsonl" --batch-size 1 --deadline 2
  expect "stopped by the deadline" contains "$out" "stopped by the deadline"
  run "continued after the deadline" 0 "${gen[@]}" "${job[@]}" --output "$work/d.jsonl"
  expect "the uninterrupted run's file" cmp "$work/ref.jsonl" "$work/d.jsonl"
  # Killed outright mid-job: the temporary file may be longer than its progress; cut back.
  L3_FAULT="generate.round@0#3=kill" run "killed (SIGKILL)" 137 "${gen[@]}" "${job[@]}" --output "$work/k.jsonl" --batch-size 1
  printf 'garbage' >>"$work/k.jsonl.partial"
  run "continued after a kill" 0 "${gen[@]}" "${job[@]}" --output "$work/k.jsonl"
  expect "the uninterrupted run's file" cmp "$work/ref.jsonl" "$work/k.jsonl"
  printf 'x' >"$work/stray.jsonl.partial"
  run "a temporary file without progress is not ours" 2 "${gen[@]}" "${job[@]}" --output "$work/stray.jsonl"
  expect "names it" contains "$err" "stray.jsonl.partial"
  expect "left alone" [ "$(cat "$work/stray.jsonl.partial")" = x ]
fi

finish_cli_checks "generate --input checks ($group)"
