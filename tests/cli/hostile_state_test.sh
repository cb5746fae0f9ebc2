#!/usr/bin/env bash
# Hostile and careless inputs, round 2 (issue 42): the paths added after the first round (DPO's
# reference, the node-local level, LoRA exports, the demo) and inputs nobody had tried. One group
# per class, each with other spellings than the issue's:
#   links:    DPO's reference directory and the node-local level are never written through a link
#   ours:     export never replaces a checkpoint's base, nor an adapter directory PEFT wrote; the
#             demo never takes over a directory without its marker, and replaces its own
#   state:    ckpt prune never counts a misnamed copy; resume keeps the user's metrics lines; a
#             hard-linked node-local file is never written over; another run's node-local files
#             are never mixed in; a damaged DPO reference table is never used
#   values:   files get the options' domains (adapters, margins); options that need another one,
#             impossible dates, unusable SLURM_JOB_END_TIME, empty paths, huge --seq-len, --beta
#   sizes:    deep JSON, FIFOs, link loops and names too long: exit 2 at once, bounded memory
#   signals:  SIGTERM/SIGUSR1/SIGINT from the first instruction: exit 75, never 2 or a kill
# Everything stays under one scratch directory; "victim" files, the targets of planted links,
# must never change.
#   hostile_state_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=$(readlink -f "${1:?usage: hostile_state_test.sh LLAMA3_HPC MPIEXEC}")
mpiexec=${2:?usage: hostile_state_test.sh LLAMA3_HPC MPIEXEC}
helper=(python3 "$(cd "$(dirname "$0")" && pwd)/hostile_files.py")
work=$(mktemp -d)
trap 'chmod -R u+rwX "$work"; rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"
cd "$work" || exit 1
unset SLURM_JOB_END_TIME

mkdir -p victim-dir && echo precious >victim-dir/keep
victim_intact() { [[ "$(ls -A "$work/victim-dir")" == keep && "$(cat "$work/victim-dir/keep")" == precious ]]; }
no_crash() { [[ $code -lt 124 ]] && ! contains "$err" "filesystem error"; }  # no signal, no hang

# --- data, a checkpoint, an export, a LoRA checkpoint on the export, its adapter ------------------
for i in $(seq 1 40); do
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "word$i" "$(echo "word$i" | rev)"
done >train.jsonl
for i in $(seq 1 16); do
  printf '{"prompt":"Reverse %s.","chosen":"%s","rejected":"%s"}\n' "w$i" "$(echo "w$i" | rev)" "w$i"
done >pairs.jsonl
run "prep sft data" 0 "$bin" prep sft --input train.jsonl --tokenizer bytes --output ds
run "prep preference data" 0 "$bin" prep preference --input pairs.jsonl --tokenizer bytes --output pairs
sft=(sft --model tiny --data "$work/ds" --seq-len 64 --global-batch 2 --lr 1e-3 --no-progress)
dpo=(dpo --init "$work/ck" --data "$work/pairs" --seq-len 128 --global-batch 2 --no-progress)
run "a checkpoint" 0 "$bin" "${sft[@]}" --steps 2 --ckpt-dir ck
run "an export" 0 "$bin" export --ckpt ck --output hf --dtype fp32
run "a LoRA checkpoint on the export" 0 "$bin" "${sft[@]}" --init "$work/hf" --steps 1 \
  --lora-rank 2 --ckpt-dir ck-lora
run "its adapter" 0 "$bin" export --ckpt ck-lora --adapter --output adapter

# --- links: DPO's reference directory --------------------------------------------------------------
mkdir -p ckd-link && ln -s "$work/victim-dir" ckd-link/reference
run "dpo where CKPT/reference is a planted link" 2 "$bin" "${dpo[@]}" --steps 1 --ckpt-dir ckd-link
expect "says it is a link" contains "$err" "symbolic link"
expect "nothing written through it" victim_intact
mkdir -p ckd-file && echo mine >ckd-file/reference
run "dpo where CKPT/reference is a file" 2 "$bin" "${dpo[@]}" --steps 1 --ckpt-dir ckd-file
expect "says it is not a directory" contains "$err" "ckd-file/reference: --ckpt-dir's reference/: exists and is not a directory"
expect "one line, no filesystem error" [ "$(error_lines "$err")" = 1 ]
run "dpo --reference-dir naming a file" 2 "$bin" "${dpo[@]}" --steps 1 --ckpt-dir ckd-x \
  --reference-dir "$work/train.jsonl"
expect "names the option" contains "$err" "--reference-dir: exists and is not a directory"
mkdir -p refdir && ln -s "$work/victim-dir/keep" refdir/train.h5
run "dpo where the stored table is a planted link" 2 "$bin" "${dpo[@]}" --steps 1 --reference-dir refdir
expect "names it" contains "$err" "refdir/train.h5"
expect "the link's target is intact" victim_intact

# --- links: the node-local level -------------------------------------------------------------------
local_opts=(--ckpt-local "$work/local" --checkpoint-every-local 1 --ckpt-dir "$work/ckl")
run "node-local checkpoints" 0 "$bin" "${sft[@]}" --steps 2 "${local_opts[@]}"
key=$(compgen -G "$work/local/llama3-hpc.*")
expect "the level's directory" [ -d "$key" ]
mv "$key" "$key.real" && ln -s "$work/victim-dir" "$key"
run "the level's directory replaced by a link" 2 "$bin" "${sft[@]}" --steps 3 "${local_opts[@]}"
expect "says so" contains "$err" "symbolic link"
expect "nothing written through it" victim_intact
rm "$key" && mv "$key.real" "$key"
ln -s "$work/victim-dir" "$key/step-00000004"
run "a step directory of the level planted as a link" 0 "$bin" "${sft[@]}" --steps 4 "${local_opts[@]}"
expect "nothing written through it" victim_intact
expect "a real directory took its place" [ -d "$key/step-00000004" ] && [ ! -L "$key/step-00000004" ]
# A hard link to an older step's state (a backup) is never written over when the file is reused.
ln "$key/step-00000003/rank-00000.state" backup.state && cp backup.state backup.orig
run "node-local steps over a hard-linked older state" 0 "$bin" "${sft[@]}" --steps 6 "${local_opts[@]}"
expect "the backup is unchanged" cmp -s backup.state backup.orig
expect "the old step is gone from the level" [ ! -e "$key/step-00000003" ]

# --- state: another run's node-local files ---------------------------------------------------------
# A run killed right after its node-local step 2 (nothing in --ckpt-dir); another run into the same
# --ckpt-dir (another --init, or another --seed) must not pick its states up.
other=(--ckpt-local "$work/local2" --checkpoint-every-local 1 --flush-every 0 --ckpt-dir "$work/ck-other")
L3_FAULT="ckpt.local.complete@0#2=kill" run "a run killed after node-local step 2" 137 \
  "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
for change in "--init $work/hf" "--init $work/ck --seed 7"; do
  # shellcheck disable=SC2086  # the words of $change are options
  run "resume with $change" 0 "$bin" "${sft[@]}" $change --steps 4 "${other[@]}"
  expect "warns of another run's files" contains "$err" "of another run"
  expect "starts from the beginning" contains "$out" "sft done: 4 steps"
  rm -rf "$work/ck-other"
  L3_FAULT="ckpt.local.complete@0#2=kill" run "the first run again" 137 \
    "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
done
run "the same run resumes from its own files" 0 "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
expect "from step 2" contains "$err" "resuming from the node-local level at step 2"
expect "2 steps left" contains "$out" "sft done: 2 steps"
# A header whose checksum holds but whose ranges are far beyond the file: refused before anything is
# allocated for them (it took 4.8 GB), the run falls back.
rm -rf "$work/ck-other" "$work/local2"
L3_FAULT="ckpt.local.complete@0#2=kill" run "a run killed after node-local step 2, again" 137 \
  "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
run "a crafted state header" 0 "${helper[@]}" state-ranges \
  "$(compgen -G "$work/local2/llama3-hpc.*")/step-00000002/rank-00000.state" 0 400000000
run "resume next to it" 0 "${helper[@]}" maxrss "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
expect "it is set aside" contains "$err" "ranges do not add up to its values"
rss=$(sed -n 's/^maxrss_mib=//p' <<<"$err")
expect "in bounded memory (${rss} MiB)" [ "${rss:-99999}" -lt 1024 ]
# A header claiming 402 M values on a sparse file of the size they need: the size check holds,
# the model its manifest describes does not (it took 4.7 GB before that check fell back).
rm -rf "$work/ck-other" "$work/local2"
L3_FAULT="ckpt.local.complete@0#2=kill" run "a run killed after node-local step 2, once more" 137 \
  "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
run "a header of 402 M values, the file as long" 0 "${helper[@]}" state-values \
  "$(compgen -G "$work/local2/llama3-hpc.*")/step-00000002/rank-00000.state" 402000000
# (--resume-verify quick: no checksums read first, which would find the arrays moved.)
run "resume next to it" 0 "${helper[@]}" maxrss "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}" \
  --resume-verify quick
expect "it is set aside" contains "$err" "trainable parameters of the model its manifest describes"
rss=$(sed -n 's/^maxrss_mib=//p' <<<"$err")
expect "in bounded memory (${rss} MiB)" [ "${rss:-99999}" -lt 1024 ]

# --- state: a damaged DPO reference table ------------------------------------------------------------
L3_FAULT="train.step@0#3=exit:9" run "dpo stopped in step 3" 9 "$bin" "${dpo[@]}" --steps 4 \
  --checkpoint-every 1 --checkpoint-sync --ckpt-dir ckd
run "a value of the stored table made positive" 0 "${helper[@]}" table-poison ckd/reference/train.h5 5.0 16
run "resume with it" 2 "$bin" "${dpo[@]}" --steps 4 --checkpoint-every 1 --ckpt-dir ckd
expect "says it is damaged" contains "$err" "damaged: its values do not match their checksum"
run "a fresh run next to a damaged table recomputes it" 0 "$bin" "${dpo[@]}" --steps 1 \
  --reference-dir "$work/ckd/reference"
expect "says why" contains "$err" "damaged"
run "the resumed run now reads the recomputed table" 0 "$bin" "${dpo[@]}" --steps 4 \
  --checkpoint-every 1 --ckpt-dir ckd

# --- state: ckpt prune never counts a misnamed copy -------------------------------------------------
run "four checkpoints" 0 "$bin" "${sft[@]}" --steps 8 --checkpoint-every 2 --keep-last 10 --ckpt-dir ckp
cp -r ckp/step-00000002 ckp/step-00000009
run "ckpt prune --keep-last 2 next to a copy named step 9" 0 "$bin" ckpt prune ckp --keep-last 2
expect "the real newest two are kept" [ -d ckp/step-00000006 ] && [ -d ckp/step-00000008 ]
expect "the older ones are removed" [ ! -e ckp/step-00000002 ] && [ ! -e ckp/step-00000004 ]
expect "the copy is left as it is" [ -f ckp/step-00000009/manifest.json ]
expect "and reported" contains "$out" "not a checkpoint: step-00000009"

# --- state: resume keeps the user's own lines of --metrics -------------------------------------------
L3_FAULT="train.step@0#4=exit:9" run "sft stopped in step 4" 9 "$bin" "${sft[@]}" --steps 4 \
  --checkpoint-every 2 --checkpoint-sync --ckpt-dir ckm --metrics m.jsonl
printf '# lr sweep A, run 1\n{"note": "restarted by hand", "step": 99}\n{"kind":"train","step":3,"lo' >>m.jsonl
run "resume appending to the metrics" 0 "$bin" "${sft[@]}" --steps 4 --checkpoint-every 2 \
  --ckpt-dir ckm --metrics m.jsonl
expect "the user's comment is kept" grep -qx '# lr sweep A, run 1' m.jsonl
expect "the user's record is kept" grep -q '"restarted by hand"' m.jsonl
expect "step 3 once, the cut line gone" [ "$(grep -c '"kind":"train".*"step":3[,}]' m.jsonl)" = 1 ]
expect "every line whole" [ "$(grep -c '"lo$' m.jsonl)" = 0 ]

# --- ours: export never replaces what a checkpoint needs, nor PEFT's adapters -----------------------
cp hf/config.json hf-config.orig
for spelling in "$work/hf" "$work/hf/" "$work/./hf" "hf"; do
  run "export --merge --overwrite onto the LoRA run's base ($spelling)" 2 \
    "$bin" export --ckpt ck-lora --merge --output "$spelling" --overwrite
  expect "names the base" contains "$err" "its LoRA base"
done
expect "the base is intact" cmp -s hf/config.json hf-config.orig
run "the LoRA checkpoint still evaluates" 0 "$bin" eval --init ck-lora --data ds
run "export --adapter --overwrite replaces its own" 0 \
  "$bin" export --ckpt ck-lora --adapter --output adapter --overwrite
cp -r adapter adapter-card && echo "# model card" >adapter-card/README.md
run "export --adapter --overwrite onto an adapter with a model card" 2 \
  "$bin" export --ckpt ck-lora --adapter --output adapter-card --overwrite
expect "names the card" contains "$err" "README.md"
cp -r adapter peft-adapter
run "an adapter as PEFT writes it" 0 "${helper[@]}" safetensors-meta peft-adapter/adapter_model.safetensors '{"format": "pt"}'
run "export --adapter --overwrite onto it" 2 \
  "$bin" export --ckpt ck-lora --adapter --output peft-adapter --overwrite
expect "says it is not ours" contains "$err" "was not written by llama3-hpc export"
expect "PEFT's adapter is intact" [ "$(cat adapter-card/README.md)" = "# model card" ]

# --- ours: the demo ------------------------------------------------------------------------------
mkdir -p mine/input mine/ckpt && echo '{"prompt":"my data"}' >mine/input/instructions.jsonl
echo keep >mine/ckpt/notes
run "demo --workdir on the user's directory shaped like a demo's" 2 "$bin" demo --workdir mine \
  --sft-steps 1 --reward-steps 1 --dpo-steps 0 --grpo-steps 0
expect "says the marker is missing" contains "$err" "marker"
expect "the user's files are intact" [ "$(cat mine/ckpt/notes)" = keep ] && \
  [ "$(cat mine/input/instructions.jsonl)" = '{"prompt":"my data"}' ]
demo=(demo --workdir "$work/demo" --sft-steps 2 --reward-steps 2 --dpo-steps 2 --grpo-steps 2 --lora)
run "the demo, DPO, GRPO and LoRA stages included" 0 "$bin" "${demo[@]}"
run "the demo again on its own directory" 0 "$bin" "${demo[@]}"
expect "its metrics are the second run's" [ "$(grep -c '"kind":"train"' demo/metrics-dpo.jsonl)" = 2 ]

# --- values: files get the options' domains ----------------------------------------------------------
for edit in "lora_alpha 1e39" "lora_alpha -8" "lora_dropout 1.0"; do
  # shellcheck disable=SC2086  # the words of $edit are the key and the value
  cp -r adapter "ad-$$" && "${helper[@]}" set-json "ad-$$/adapter_config.json" ${edit}
  run "an adapter_config.json with ${edit}" 2 "$bin" eval --init hf --adapter "ad-$$" --data ds
  expect "names the file and field" contains "$err" "ad-$$/adapter_config.json: ${edit%% *}"
  run "--init-adapter of it" 2 "$bin" "${sft[@]}" --init "$work/hf" --init-adapter "$work/ad-$$" --steps 1
  rm -rf "ad-$$"
done
cp -r adapter ad-nan
run "an adapter weight made NaN" 0 "${helper[@]}" safetensors-poison ad-nan/adapter_model.safetensors \
  base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight 3
run "eval with it" 2 "$bin" eval --init hf --adapter ad-nan --data ds
expect "names the tensor" contains "$err" "lora_A.weight': element 3 is nan"
for margin in 1e39 -1e39 1e400 2e6; do
  printf '{"prompt":"a","chosen":"b","rejected":"c"}\n{"prompt":"a","chosen":"b","rejected":"c","margin":%s}\n' \
    "$margin" >margin.jsonl
  run "prep of a margin of $margin" 2 "$bin" prep preference --input margin.jsonl --tokenizer bytes --output "m-$margin"
  expect "names the line" contains "$err" "margin.jsonl:2:"
done

# --- values: options ---------------------------------------------------------------------------------
while read -r option value needs <&3; do
  run "$option $value without $needs" 2 "$bin" "${sft[@]}" --steps 1 --ckpt-dir ck-opt "$option" "$value"
  expect "names what it needs" contains "$err" "$needs"
done 3<<'LIST'
--lora-alpha 16 --lora-rank
--lora-targets q,v --lora-rank
--lora-dropout 0.1 --lora-rank
--flush-every 5 --ckpt-local
--ckpt-redundancy xor --ckpt-local
--ckpt-xor-set 4 --ckpt-local
LIST
for deadline in 2030-02-30T00:00:00Z 2031-02-29T12:00Z 2030-04-31T00:00Z 2030-01-01T00:00+25:00; do
  run "--deadline $deadline" 2 "$bin" "${sft[@]}" --steps 1 --ckpt-dir ck-opt --deadline "$deadline"
  expect "says it is not a date" contains "$err" "not a valid"
done
SLURM_JOB_END_TIME=garbage run "SLURM_JOB_END_TIME=garbage" 0 "$bin" "${sft[@]}" --steps 1 --ckpt-dir ck-slurm
expect "warns that it is ignored" contains "$err" "SLURM_JOB_END_TIME='garbage' is not a time"
for option in --ckpt-dir --metrics --ckpt-local --init; do
  run "$option ''" 2 "$bin" "${sft[@]}" --steps 1 "$option" ''
  expect "says it is empty" contains "$err" "$option is empty"
done
printf 'ckpt-dir =\n' >empty.ini
run "ckpt-dir = (empty) in a config file" 2 "$bin" "${sft[@]}" --steps 1 --config empty.ini
run "eval --seq-len beyond the model's positions" 2 "$bin" eval --init ck --data ds --seq-len 16777216
expect "says so" contains "$err" "beyond the model's"
for beta in "1e300" "1e-30 --loss ipo" "0"; do
  # shellcheck disable=SC2086  # the words of $beta are options
  run "dpo --beta $beta" 2 "$bin" "${dpo[@]}" --steps 1 --beta $beta
  expect "names --beta" contains "$err" "--beta"
done
gzip -c train.jsonl >whole.jsonl.gz
{ cat whole.jsonl.gz; echo "not gzip"; } >trailing.jsonl.gz
run "prep of a gzip file with trailing data" 2 "$bin" prep sft --input trailing.jsonl.gz --tokenizer bytes --output gz-t
expect "says so" contains "$err" "trailing.jsonl.gz: trailing data after the gzip stream"
{ cat whole.jsonl.gz; head -c 512 /dev/zero; } >padded.jsonl.gz
run "prep of a gzip file padded with zeros (as gzip accepts)" 0 "$bin" prep sft --input padded.jsonl.gz --tokenizer bytes --output gz-p
{ cat whole.jsonl.gz whole.jsonl.gz; } >members.jsonl.gz
run "prep of two gzip members" 0 "$bin" prep sft --input members.jsonl.gz --tokenizer bytes --output gz-m
expect "reads both" contains "$out" "80 records read"

# --- sizes: deep JSON, never a crash --------------------------------------------------------------
cp -r adapter ad-deep && "${helper[@]}" deep-into ad-deep/adapter_config.json target_modules 50000
run "an adapter_config.json nested 50,000 levels" 2 timeout 60 "$bin" eval --init hf --adapter ad-deep --data ds
expect "says so" contains "$err" "nested deeper than 256 levels"
cp hf/tokenizer.json deep-tokenizer.json 2>/dev/null || echo '{"model":{"type":"BPE","vocab":{},"merges":[]}}' >deep-tokenizer.json
"${helper[@]}" deep-into deep-tokenizer.json pre_tokenizer 60000
run "a tokenizer.json whose pre_tokenizer is nested 60,000 levels" 2 timeout 60 "$bin" tokenize --tokenizer deep-tokenizer.json </dev/null
expect "says so" contains "$err" "nested deeper"
cp hf/config.json deep-config.json && "${helper[@]}" deep-into deep-config.json rope_scaling 200000
run "a model config.json nested 200,000 levels" 2 timeout 60 "$bin" sft --model deep-config.json \
  --data ds --seq-len 64 --global-batch 2 --steps 1
expect "says so" contains "$err" "nested deeper"
cp -r ck/step-00000002 deep-step && "${helper[@]}" deep-into deep-step/manifest.json metrics 300000
run "a manifest.json nested 300,000 levels" 2 timeout 60 "$bin" ckpt verify deep-step
expect "no crash" no_crash
cp -r ds deep-ds && "${helper[@]}" deep-into deep-ds/index.json stats 300000
run "an index.json nested 300,000 levels" 2 timeout 60 "$bin" eval --init ck --data deep-ds
expect "says so" contains "$err" "nested deeper"
printf '{"prompt": "a", "completion": %s}\n' "$(printf '%*s' 100000 '' | tr ' ' '[')$(printf '%*s' 100000 '' | tr ' ' ']')" >deep.jsonl
run "a JSONL record nested 100,000 levels" 2 timeout 60 "$bin" prep sft --input deep.jsonl --tokenizer bytes --output deep-out
expect "names the line" contains "$err" "deep.jsonl:1: JSON nested deeper"
# A manifest whose "metrics" is 40 million zeros (80 MB): refused before it is parsed (it took
# 2.2 GB), at bounded memory.
cp -r ck/step-00000002 big-step && "${helper[@]}" big-list big-step/manifest.json metrics 40000000
run "ckpt verify of an 80 MB manifest" 2 "${helper[@]}" maxrss "$bin" ckpt verify big-step
expect "says it is too large" contains "$out$err" "longer than 64 MiB"
rss=$(sed -n 's/^maxrss_mib=//p' <<<"$err")
expect "in bounded memory (${rss} MiB)" [ "${rss:-99999}" -lt 512 ]
rm -rf big-step

# --- sizes: FIFOs where files belong, never a hang --------------------------------------------------
fifo_in() { rm -f "$1" && mkfifo "$1"; }
cp -r ck ck-fifo && fifo_in ck-fifo/latest
run "a FIFO as latest (ckpt list)" 2 timeout 30 "$bin" ckpt list ck-fifo
expect "names it" contains "$err" "ck-fifo/latest: is a named pipe (FIFO)"
run "a FIFO as latest (--init)" 2 timeout 30 "$bin" "${sft[@]}" --init "$work/ck-fifo" --steps 1
cp -r ck/step-00000002 step-fifo && fifo_in step-fifo/model.h5
run "a FIFO as model.h5" 2 timeout 30 "$bin" eval --init step-fifo --data ds
expect "names it" contains "$err" "model.h5: is a named pipe (FIFO)"
fifo_in fifo.ini
run "a FIFO as --config" 2 timeout 30 "$bin" "${sft[@]}" --steps 1 --config fifo.ini
for file in adapter_config.json adapter_model.safetensors; do
  cp -r adapter ad-fifo && fifo_in "ad-fifo/$file"
  run "a FIFO as $file" 2 timeout 30 "$bin" eval --init hf --adapter ad-fifo --data ds
  expect "names it" contains "$err" "$file: is a named pipe (FIFO)"
  rm -rf ad-fifo
done
cp -r ds ds-fifo && fifo_in ds-fifo/index.json
run "a FIFO as index.json" 2 timeout 30 "$bin" eval --init ck --data ds-fifo
shard=$(cd ds && compgen -G "part-*.h5" | head -1)
cp -r ds ds-fifo2 && fifo_in "ds-fifo2/$shard"
run "a FIFO as a shard" 2 timeout 30 "$bin" eval --init ck --data ds-fifo2
expect "names it" contains "$err" "$shard: is a named pipe (FIFO)"
fifo_in fifo.model
run "a FIFO as the tokenizer" 2 timeout 30 "$bin" tokenize --tokenizer fifo.model </dev/null
rm -rf "$work/ck-other" "$work/local2"
L3_FAULT="ckpt.local.complete@0#2=kill" run "a run killed after node-local step 2, once more" 137 \
  "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
fifo_in "$(compgen -G "$work/local2/llama3-hpc.*")/step-00000002/rank-00000.state"
run "a FIFO as a node-local state: set aside, the run goes on" 0 timeout 60 \
  "$bin" "${sft[@]}" --init "$work/ck" --steps 4 "${other[@]}"
expect "names it" contains "$err" "rank-00000.state: is a named pipe (FIFO)"

# --- sizes: link loops, links to /, names too long: a sentence and exit 2 -----------------------
cp -r ck ck-loop && ln -s step-00000005 ck-loop/step-00000005 && ln -s / ck-loop/step-00000007
run "ckpt list next to a link loop and a link to /" 0 timeout 30 "$bin" ckpt list ck-loop
expect "not followed" contains "$out" "a symbolic link, not a checkpoint (not followed)"
run "ckpt verify of them" 2 timeout 30 "$bin" ckpt verify ck-loop
expect "no filesystem error" no_crash
run "ckpt list --ckpt-local with a name too long" 2 "$bin" ckpt list ck \
  --ckpt-local "$work/$(printf '%*s' 300 '' | tr ' ' a)%h"
expect "says so" contains "$err" "too long"

# --- signals: from the first instruction to the last ------------------------------------------------
L3_FAULT="cli.run@0=raise:TERM" run "SIGTERM before the model is loaded" 75 \
  "$bin" "${sft[@]}" --steps 2 --ckpt-dir ck-sig
expect "says nothing was lost" contains "$out" "stopped by SIGTERM before its first step, with nothing to save"
L3_FAULT="cli.run@1=raise:USR1" run "SIGUSR1 on rank 1 while starting, 2 ranks" 75 \
  "$mpiexec" -n 2 "$bin" "${sft[@]}" --steps 2 --ckpt-dir ck-sig
L3_FAULT="dpo.reference@1#2=raise:TERM" run "SIGTERM on rank 1 during DPO's reference precompute" 75 \
  "$mpiexec" -n 2 "$bin" "${dpo[@]}" --steps 2 --ckpt-dir ckd-sig
run "the same command again" 0 "$mpiexec" -n 2 "$bin" "${dpo[@]}" --steps 2 --ckpt-dir ckd-sig
L3_FAULT="train.step@0#2=raise:INT" run "SIGINT during training, 2 ranks" 75 \
  "$mpiexec" -n 2 "$bin" "${sft[@]}" --steps 4 --ckpt-dir ck-int
expect "with a checkpoint of step 2 (raised at its start)" [ "$(cat ck-int/latest)" = step-00000002 ]
expect "no bad termination" lacks "$out$err" "BAD TERMINATION"
# Ctrl-C at the terminal: mpiexec forwards SIGINT to the ranks, which stop cleanly.
L3_FAULT="train.step@*#2=sleep:5" "$mpiexec" -n 2 "$bin" "${sft[@]}" --steps 4 --ckpt-dir ck-ctrlc \
  --metrics ctrlc.jsonl >ctrlc.out 2>&1 &
launcher=$!
for _ in $(seq 1 600); do
  grep -q '"step":1' ctrlc.jsonl 2>/dev/null && break
  sleep 0.1
done
kill -INT "$launcher"
wait "$launcher"
code=$?
out=$(cat ctrlc.out) err=""
# The ranks exit 75; what MPICH's mpiexec then returns after forwarding a Ctrl-C is its own
# (75 or 0 here, from run to run): what must hold is that no rank was killed.
expect "Ctrl-C to mpiexec: the ranks stop cleanly (mpiexec: $code)" contains "$out" "sft stopped at step 2 with checkpoint"
expect "no bad termination" lacks "$out" "BAD TERMINATION"
expect "with a checkpoint" [ "$(cat ck-ctrlc/latest)" = step-00000002 ]

finish_cli_checks "hostile-state checks"
