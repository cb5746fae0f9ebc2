#!/usr/bin/env bash
# Hostile and careless inputs, one group of checks per class (docs/CLI.md, "What llama3-hpc
# writes, replaces and removes"; "Limits"):
#   replace:  --overwrite replaces only a directory we wrote, never ".", its parents or a home
#   links:    nothing is written through a link we did not create (temporary names, latest,
#             step directories, metrics)
#   steps:    a step directory's name is its step
#   gzip:     a cut .gz input is an error, not a shorter dataset
#   outputs:  every output location is checked before the first step
#   sizes:    no hang and no unbounded memory from a number or a line
#   domains:  every numeric option and config field checked at the edge, the file named
#   messages: malformed files get one line naming them, exit 2
# Everything these runs write stays under one scratch directory; a "victim" file outside the
# outputs, the target of every planted link, must never change.
#   hostile_input_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=$(readlink -f "${1:?usage: hostile_input_test.sh LLAMA3_HPC MPIEXEC}")
mpiexec=${2:?usage: hostile_input_test.sh LLAMA3_HPC MPIEXEC}
work=$(mktemp -d)
trap 'chmod -R u+rwX "$work"; rm -rf "$work"' EXIT
chmod 755 "$work"
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"
cd "$work" || exit 1

echo precious >"$work/victim"
victim_intact() { [[ "$(cat "$work/victim")" == precious ]]; }

# An unprivileged run, for permission checks: as root (CI), the same command as user nobody
# (root ignores permissions); otherwise the command itself. Nobody runs a copy of the program
# in the scratch directory: the build may be where only root may read (/root/...).
ubin="$work/llama3-hpc"
cp "$bin" "$ubin" && chmod 755 "$ubin"
unprivileged() {
  if [[ $(id -u) -eq 0 ]]; then
    setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
  else
    "$@"
  fi
}

# --- data and a checkpoint to work with ---------------------------------------------------
for i in $(seq 1 40); do
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "word$i" "$(echo "word$i" | rev)"
done >"$work/train.jsonl"
for i in $(seq 1 16); do
  printf '{"prompt":"Reverse %s.","chosen":"%s","rejected":"%s"}\n' "w$i" "$(echo "w$i" | rev)" "w$i"
done >"$work/pairs.jsonl"
run "prep sft data" 0 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds"
run "prep preference data" 0 "$bin" prep preference --input "$work/pairs.jsonl" --tokenizer bytes --output "$work/pairs"
sft_any_batch=(sft --model tiny --data "$work/ds" --seq-len 64 --lr 1e-3 --no-progress)
sft=("${sft_any_batch[@]}" --global-batch 2)
run "a checkpoint" 0 "$bin" "${sft[@]}" --steps 2 --ckpt-dir "$work/ck"
run "an export" 0 "$bin" export --ckpt "$work/ck" --output "$work/hf" --dtype fp32

# --- replace: only what we wrote, never the current directory or above it ------------------
mkdir -p "$work/w/inner" && echo keep >"$work/w/notes.txt"
cd "$work/w" || exit 1
for spelling in . ./ ../w "$work/w" "$work/w/" inner/.. "$work/w/inner/.."; do
  run "export --output $spelling --overwrite from inside it" 2 \
    "$bin" export --ckpt "$work/ck" --output "$spelling" --overwrite
  expect "names the current directory" contains "$err" "is the current directory or holds it"
done
run "prep --output . --overwrite" 2 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output . --overwrite
cd "$work/w/inner" || exit 1
run "export --output .. (a parent) --overwrite" 2 "$bin" export --ckpt "$work/ck" --output .. --overwrite
cd "$work" || exit 1
expect "the current directory and its notes are intact" [ "$(cat "$work/w/notes.txt")" = keep ]
mkdir -p "$work/OUT" && echo keep >"$work/OUT/notes.txt"
for spelling in OUT OUT/ OUT/. ./OUT "$work/OUT//"; do
  run "export --overwrite onto a directory not ours ($spelling)" 2 \
    "$bin" export --ckpt "$work/ck" --output "$spelling" --overwrite
  expect "names what is not ours" contains "$err" "it holds notes.txt"
done
expect "its content is intact" [ "$(cat "$work/OUT/notes.txt")" = keep ]
mkdir -p "$work/fakehome/.ssh" && echo key >"$work/fakehome/.ssh/id" && echo rc >"$work/fakehome/.bashrc"
run "prep --overwrite onto a home directory" 2 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/fakehome" --overwrite
expect "says it is not a dataset of ours" contains "$err" "not a dataset written by llama3-hpc prep"
expect "the home is intact" [ "$(cat "$work/fakehome/.ssh/id")" = key ]
ln -s "$work/ds" "$work/ds-link"
run "prep --overwrite onto a link to a dataset" 2 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds-link" --overwrite
expect "says it is a link" contains "$err" "symbolic link"
run "prep --overwrite replaces its own dataset" 0 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds" --overwrite
run "export --overwrite replaces its own export" 0 \
  "$bin" export --ckpt "$work/ck" --output "$work/hf" --dtype fp32 --overwrite
run "export without --overwrite onto its own export" 2 "$bin" export --ckpt "$work/ck" --output "$work/hf"
mkdir -p "$work/E.partial" && echo keep >"$work/E.partial/x"
run "export next to a directory named OUT.partial" 0 "$bin" export --ckpt "$work/ck" --output "$work/E"
expect "OUT.partial is left alone" [ "$(cat "$work/E.partial/x")" = keep ]
run "prep --output with a trailing slash" 0 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/newds/"
expect "the dataset is the directory itself" [ -f "$work/newds/index.json" ]
run "prep --output ''" 2 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output ''
mkdir -p "$work/demo-home" && echo keep >"$work/demo-home/thesis.tex"
run "demo --workdir holding other files" 2 "$bin" demo --workdir "$work/demo-home"
expect "names the file" contains "$err" "thesis.tex"
expect "the file is intact" [ "$(cat "$work/demo-home/thesis.tex")" = keep ]
# Staging directories left by killed runs (SIGTERM, SIGKILL) of this host are removed by the next
# run, when their marker proves them that run's; nothing is removed by its name alone: the user's
# own directories of such names, an earlier version's, a live process's, another host's, links.
host=$(uname -n)
for d in "ds2.partial-$host-99999999-0" "ds2.partial-99999999-7" "ds2.partial-$host-$$-0" \
  "ds2.partial-elsewhere.example-99999999-0" ds2.old-2024-06 ds2.partial-2024-11 ds2.old-1-2; do
  mkdir -p "$work/$d/train" && echo keep >"$work/$d/notes.txt"
done
mkdir -p "$work/ds2.old-$host-99999999-4" && echo keep >"$work/ds2.old-$host-99999999-4/notes.txt"
printf '{"staging": "ds2.old-%s-99999999-3", "host": "%s", "pid": 99999999}\n' "$host" "$host" \
  >"$work/ds2.old-$host-99999999-4/.llama3-hpc-staging"  # a marker naming another directory
ln -s "$work/OUT" "$work/ds2.partial-$host-99999998-0"
run "prep next to directories named like staging" 0 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds2"
for d in "ds2.partial-$host-99999999-0" "ds2.partial-99999999-7" "ds2.partial-$host-$$-0" \
  "ds2.partial-elsewhere.example-99999999-0" ds2.old-2024-06 ds2.partial-2024-11 ds2.old-1-2 \
  "ds2.old-$host-99999999-4"; do
  expect "$d, not provably ours, is kept" [ "$(cat "$work/$d/notes.txt")" = keep ]
done
expect "a link is kept, its target intact" [ "$(cat "$work/OUT/notes.txt")" = keep ]
mkdir -p "$work/exp.old-2024-06" "$work/exp.partial-2024-11" && echo keep >"$work/exp.old-2024-06/x" \
  && echo keep >"$work/exp.partial-2024-11/x"
run "export next to the user's exp.old-2024-06 and exp.partial-2024-11" 0 \
  "$bin" export --ckpt "$work/ck" --output "$work/exp" --dtype fp32
expect "both are intact" [ "$(cat "$work/exp.old-2024-06/x")$(cat "$work/exp.partial-2024-11/x")" = keepkeep ]
run "export --overwrite next to them" 0 \
  "$bin" export --ckpt "$work/ck" --output "$work/exp" --dtype fp32 --overwrite
expect "both are still intact" [ "$(cat "$work/exp.old-2024-06/x")$(cat "$work/exp.partial-2024-11/x")" = keepkeep ]
# A prep stopped by SIGTERM (no handler: the process ends) leaves its staging directory; the next
# run removes it.
L3_FAULT="prep.shard@0=raise:TERM" run "prep stopped by SIGTERM" 143 \
  "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds3"
expect "left its staging directory" [ -n "$(compgen -G "$work/ds3.partial-*")" ]
run "the next prep" 0 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/ds3"
expect "removed it" [ -z "$(compgen -G "$work/ds3.partial-*")" ]
mkdir -p "$work/readonly" && chmod 555 "$work/readonly"
run "export into a directory that cannot be written" 2 \
  unprivileged "$ubin" export --ckpt "$work/ck" --output "$work/readonly/model"
expect "names the directory" contains "$err" "$work/readonly"
run "prep into a directory that cannot be written" 2 \
  unprivileged "$ubin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/readonly/ds"

# --- links: never written through ------------------------------------------------------------
mkdir -p "$work/ck-links"
for name in latest.tmp manifest.json.tmp latest step-00000002.partial; do
  ln -s "$work/victim" "$work/ck-links/$name"
done
run "checkpoints next to planted links" 0 \
  "$bin" "${sft[@]}" --steps 4 --checkpoint-every 2 --ckpt-dir "$work/ck-links"
expect "the links' target is intact" victim_intact
expect "latest is a file of ours" [ ! -L "$work/ck-links/latest" ] && [ "$(cat "$work/ck-links/latest")" = step-00000004 ]
ln -s "$work/victim" "$work/metrics-link.jsonl"
run "--metrics naming a link" 2 "$bin" "${sft[@]}" --steps 1 --metrics "$work/metrics-link.jsonl"
expect "says so" contains "$err" "symbolic link"
expect "the target is intact" victim_intact
cp -r "$work/ck-links/step-00000004" "$work/moved-step"
ln -s "$work/moved-step" "$work/ck-links/step-00000099"
run "resume where a step directory is a link" 0 "$bin" "${sft[@]}" --steps 6 --ckpt-dir "$work/ck-links"
expect "the link is set aside" [ -L "$work/ck-links/step-00000099.damaged" ]
expect "nothing written into its target" [ ! -e "$work/moved-step/why-damaged.txt" ]
expect "resumed from the real newest" contains "$err" "resuming from $work/ck-links/step-00000004"

# --- steps: a directory's name is its step -------------------------------------------------
cp -r "$work/ck-links/step-00000004" "$work/ck-links/step-9223372036854775807"
run "resume next to a copy under a later step's name" 0 \
  "$bin" "${sft[@]}" --steps 8 --checkpoint-every 2 --ckpt-dir "$work/ck-links"
expect "resumed from the real newest" contains "$err" "resuming from $work/ck-links/step-00000006"
expect "the copy is set aside" [ -d "$work/ck-links/step-9223372036854775807.damaged" ]
expect "with the reason" contains "$(cat "$work/ck-links/step-9223372036854775807.damaged/why-damaged.txt")" "its manifest is of step 4"
expect "the run's checkpoints go on" [ "$(cat "$work/ck-links/latest")" = step-00000008 ]
mkdir -p "$work/ck-copy" && cp -r "$work/ck/step-00000002" "$work/ck-copy/step-00000007"
run "ckpt verify of a copy under another step's name" 2 "$bin" ckpt verify "$work/ck-copy"
expect "names the mismatch" contains "$out" "named for step 7, its manifest is of step 2"
mkdir -p "$work/ck-negative" && cp -r "$work/ck/step-00000002" "$work/ck-negative/copy"
python3 - "$work/ck-negative/copy/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["step"] = -5; json.dump(m, open(sys.argv[1], "w"))
PY
run "a manifest with a negative step" 2 "$bin" ckpt verify "$work/ck-negative/copy"
expect "is damaged" contains "$out" "cannot describe a run"
cp -r "$work/ck/step-00000002" "$work/ck-renamed" && mv "$work/ck-renamed" "$work/step-00000005"
run "--init from a step directory under another step's name" 2 "$bin" "${sft[@]}" --steps 1 --init "$work/step-00000005"
expect "names the mismatch" contains "$err" "named for step 5, its manifest is of step 2"

# --- gzip: a cut stream is an error ---------------------------------------------------------
gzip -c "$work/train.jsonl" >"$work/whole.jsonl.gz"
head -c 200 "$work/whole.jsonl.gz" >"$work/cut.jsonl.gz"
head -c 10 "$work/whole.jsonl.gz" >"$work/header.jsonl.gz"
for f in cut header; do
  run "prep of a $f-only gzip file" 2 "$bin" prep sft --input "$work/$f.jsonl.gz" --tokenizer bytes --output "$work/gz-$f"
  expect "says truncated and names it" contains "$err" "$f.jsonl.gz: truncated gzip data"
  expect "writes nothing" [ ! -e "$work/gz-$f" ]
done
run "prep of the whole gzip file" 0 "$bin" prep sft --input "$work/whole.jsonl.gz" --tokenizer bytes --output "$work/gz-whole"
expect "every record" contains "$out" "40 records read, 40 kept"

# --- outputs: checked before the first step ---------------------------------------------------
for ckpt_dir in "$work/victim/ck" "$work/victim"; do
  run "--ckpt-dir $ckpt_dir cannot be a directory" 2 timeout 30 \
    "$bin" "${sft[@]}" --steps 1000000 --ckpt-dir "$ckpt_dir" --metrics "$work/never.jsonl"
  expect "names the option" contains "$err" "--ckpt-dir"
  expect "no step ran" [ ! -e "$work/never.jsonl" ]
done
run "an unwritable --ckpt-dir on 2 ranks" 2 unprivileged timeout 60 "$mpiexec" -n 2 \
  "$ubin" "${sft[@]}" --steps 1000000 --ckpt-dir "$work/readonly/ck"
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names it" contains "$err" "$work/readonly/ck: --ckpt-dir: cannot create the directory"
run "an unwritable --metrics" 2 unprivileged timeout 30 "$ubin" "${sft[@]}" --steps 1000000 \
  --metrics "$work/readonly/m.jsonl"

# --- sizes: nothing hangs or fills the memory ----------------------------------------------------
run "--epochs 9223372036854775807" 2 timeout 20 "$bin" "${sft[@]}" --epochs 9223372036854775807
expect "names the bound" contains "$err" "--epochs 9223372036854775807: must be a number in [0, 10000]"
run "--epochs 3 runs three epochs" 0 "$bin" "${sft[@]}" --epochs 3
# The most epochs allowed are planned at once (their steps counted for the schedule); the
# deadline then stops the run after its first step (exit 75).
run "--epochs 10000 plans at once" 75 timeout 60 "$bin" "${sft[@]}" --epochs 10000 \
  --ckpt-dir "$work/ck-epochs" --deadline 1
expect "with the steps of every epoch" contains "$err" "200000 steps of 2 rows"
python3 - "$work/hf/config.json" "$work/layers.json" num_hidden_layers 1e9 <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c[sys.argv[3]] = float(sys.argv[4]); json.dump(c, open(sys.argv[2], "w"))
PY
for dry in "" --dry-run-memory; do
  run "a config with 1e9 layers ${dry}" 2 timeout 20 "$bin" sft --model "$work/layers.json" --data "$work/ds" --global-batch 2 --seq-len 64 $dry
  expect "names the file and field" contains "$err" "$work/layers.json: num_hidden_layers 1000000000 is beyond any model"
done
run "--global-batch 1000000000" 2 timeout 20 "$bin" "${sft_any_batch[@]}" --global-batch 1000000000 --steps 1
run "a global batch whose data cannot fit in memory" 2 timeout 20 "$bin" "${sft_any_batch[@]}" --global-batch 16000000 --steps 1
expect "says what does not fit" contains "$err" "of host memory per rank"
expect "names the options" contains "$err" "--global-batch"
run "eval --micro-batch 1000000000" 2 timeout 20 "$bin" eval --init "$work/ck" --data "$work/ds" --micro-batch 1000000000
run "eval with a micro-batch that cannot fit" 2 timeout 20 "$bin" eval --init "$work/ck" --data "$work/ds" --micro-batch 10000000
expect "says what does not fit" contains "$err" "--micro-batch"
run "generate --max-new 9223372036854775807" 2 timeout 20 "$bin" generate --init "$work/ck" --prompt hi --max-new 9223372036854775807
run "--config /dev/zero" 2 timeout 20 "$bin" "${sft[@]}" --steps 1 --config /dev/zero
expect "says it is no file" contains "$err" "/dev/zero: is a character device, not a config file"
head -c $((16 * 1024 * 1024 + 1)) /dev/zero | tr '\0' '#' >"$work/huge.ini"
run "a config file over 16 MiB" 2 timeout 20 "$bin" "${sft[@]}" --steps 1 --config "$work/huge.ini"
expect "names the limit" contains "$err" "$work/huge.ini: longer than 16 MiB: not a config file"
rm -f "$work/huge.ini"
run "--config naming a directory" 2 "$bin" "${sft[@]}" --steps 1 --config "$work"
expect "says so" contains "$err" "is a directory, not a config file"
run "tokenize < /dev/zero" 2 timeout 60 "$bin" tokenize --tokenizer bytes </dev/zero
expect "names the line and the limit" contains "$err" "stdin:1: a line longer than 256 MiB"

# --- domains: every number checked at the edge ----------------------------------------------
while read -r option value <&3; do
  run "sft $option $value" 2 "$bin" "${sft[@]}" --steps 1 --ckpt-dir "$work/ck-domains" "$option" "$value"
  expect "one line" [ "$(lines "$err")" = 1 ]
  expect "naming the option" contains "$err" "$option"
done 3<<'LIST'
--lr inf
--lr nan
--lr -1e-3
--min-lr nan
--grad-clip nan
--grad-clip -1
--adam-eps -1
--adam-eps 0
--beta1 -0.1
--beta2 1
--weight-decay -1
--seq-len 0
--micro-batch -1
--warmup -5
--bucket-mb inf
--prefetch-depth 0
--keep-last 1
--deadline-margin nan
--peak-tflops -inf
--seed -1
--deadline 2020-01-01T00:00:00Z
--deadline inf
--dry-run-ranks -1
--device -2
LIST
run "reward --center-rewards nan" 2 "$bin" reward --model tiny --data "$work/pairs" --global-batch 2 --center-rewards nan
run "generate --temperature nan" 2 "$bin" generate --init "$work/ck" --prompt hi --temperature nan
run "generate --top-p 0" 2 "$bin" generate --init "$work/ck" --prompt hi --top-p 0
run "prep --val-fraction 1" 2 "$bin" prep sft --input "$work/train.jsonl" --tokenizer bytes --output "$work/x" --val-fraction 1
printf 'grad-clip = 1\nadam-eps = -1\n' >"$work/bad.ini"
run "a bad number in a config file" 2 "$bin" "${sft[@]}" --steps 1 --config "$work/bad.ini"
expect "names the file and option" contains "$err" "$work/bad.ini: --adam-eps -1: must be a finite number > 0"
python3 - "$work/hf/config.json" "$work/half.json" hidden_size 64.5 <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c[sys.argv[3]] = float(sys.argv[4]); json.dump(c, open(sys.argv[2], "w"))
PY
run "hidden_size 64.5 in a config.json" 2 "$bin" sft --model "$work/half.json" --data "$work/ds" --global-batch 2 --seq-len 64 --steps 1
expect "names the file and field" contains "$err" "$work/half.json: \"hidden_size\" must be a whole number"

# --- messages: malformed files named, exit 2 ------------------------------------------------------
cp -r "$work/ck-links" "$work/ck-prune2" && chmod 555 "$work/ck-prune2"
run "ckpt prune of a read-only directory" 2 unprivileged "$ubin" ckpt prune "$work/ck-prune2" --keep-last 2
expect "names what was not removed" contains "$err" "not removed: step-0000000"
run "ckpt prune of a missing directory" 2 "$bin" ckpt prune "$work/none"
mkdir -p "$work/hf-array" && cp "$work/hf/model.safetensors" "$work/hf-array/" && echo '[]' >"$work/hf-array/config.json"
run "a config.json holding []" 2 "$bin" generate --init "$work/hf-array" --tokenizer bytes --prompt hi
expect "names it" contains "$err" "$work/hf-array/config.json: holds a JSON array, not an object"
: >"$work/empty.model"
run "an empty tokenizer.model" 2 "$bin" tokenize --tokenizer "$work/empty.model" </dev/null
expect "names it" contains "$err" "$work/empty.model: empty"
echo '{"model":{"type":"BPE","vocab":{"a":"x"},"merges":[]}}' >"$work/typed.json"
run "a tokenizer.json with wrong field types" 2 "$bin" tokenize --tokenizer "$work/typed.json" </dev/null
expect "names it" contains "$err" "$work/typed.json: "
run "export into shards" 0 "$bin" export --ckpt "$work/ck" --output "$work/hf-sharded" --shard-size 100KB
rm "$work/hf-sharded/model-00002-of-00004.safetensors"
run "a safetensors index whose shard is missing" 2 "$bin" eval --init "$work/hf-sharded" --data "$work/ds"
expect "names the missing shard" contains "$err" "names model-00002-of-00004.safetensors, which is missing"
mkdir -p "$work/secret" && cp "$work/train.jsonl" "$work/secret/" && chmod 700 "$work/secret"
run "an input in an unreadable directory" 2 unprivileged "$ubin" prep sft --input "$work/secret/*.jsonl" --tokenizer bytes --output "$work/never"
expect "says it cannot be read" contains "$err" "cannot read the directory it is in"

expect "no planted link was ever followed" victim_intact
finish_cli_checks "hostile-input checks"
