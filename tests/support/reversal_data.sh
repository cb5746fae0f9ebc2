# shellcheck shell=bash
# Sourced by the shell tests: the synthetic task they train on. write_reversal_jsonl DIR writes
# DIR/sft.jsonl (120 "Reverse X." prompts with X reversed as the completion) and DIR/pref.jsonl
# (120 pairs: the reversal chosen, a wrong answer rejected); prep_reversal_data BIN DIR also
# prepares them with the bytes tokenizer into DIR/sft and DIR/pref (non-zero exit on failure).
write_reversal_jsonl() {
  local dir=$1 i w
  for i in $(seq 1 120); do
    w="word$((i % 37))x$((i % 5))"
    printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "$w" "$(echo "$w" | rev)"
  done >"$dir/sft.jsonl"
  for i in $(seq 1 120); do
    w="item$((i % 29))y$((i % 3))"
    printf '{"prompt":"Reverse %s.","chosen":"%s","rejected":"%s ?"}\n' "$w" "$(echo "$w" | rev)" "$w"
  done >"$dir/pref.jsonl"
}
prep_reversal_data() {
  local bin=$1 dir=$2
  write_reversal_jsonl "$dir" &&
    "$bin" prep sft --input "$dir/sft.jsonl" --tokenizer bytes --output "$dir/sft" >/dev/null 2>&1 &&
    "$bin" prep preference --input "$dir/pref.jsonl" --tokenizer bytes --output "$dir/pref" \
      >/dev/null 2>&1
}
# write_reversal_prompts SFT_JSONL OUT_JSONL: the SFT records' prompts as GRPO's prompt records,
# their completion as the "answer", and an "id" carried along.
write_reversal_prompts() {
  python3 - "$1" "$2" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for i, line in enumerate(open(sys.argv[1])):
        r = json.loads(line)
        out.write(json.dumps({"prompt": r["prompt"], "answer": r["completion"], "id": i}) + "\n")
PY
}
# reversal_workdir BIN NAME: a temporary directory named after NAME, removed when the shell exits,
# with the data prepared in it; its path in $work. Exits 1 when preparing fails.
reversal_workdir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$2-XXXXXX")
  # shellcheck disable=SC2064  # the path is fixed now
  trap "rm -rf '$work'" EXIT
  if ! prep_reversal_data "$1" "$work"; then
    echo "prep failed"
    exit 1
  fi
}
