#!/usr/bin/env bash
# The Hugging Face tokenizer files `export` writes for data prepared with Meta's tokenizer.model,
# checked with Hugging Face's JavaScript implementations (tests/data/hf_tokenizer_check.mjs):
# the same ids as Meta's reference encodings and as `llama3-hpc tokenize` on real text (the
# docs), and the chat template, rendered and encoded, gives prep's ids.
# Needs Meta's tokenizer (L3_LLAMA3_TOKENIZER, L3_TOKENIZER_GOLDEN), node, and the npm packages
# @huggingface/tokenizers and @huggingface/jinja in L3_NODE_MODULES (.ci/run installs them);
# skips (77) with a reason otherwise.
#   hf_tokenizer_test.sh LLAMA3_HPC SOURCE_DIR
set -uo pipefail
bin=${1:?usage: hf_tokenizer_test.sh LLAMA3_HPC SOURCE_DIR}
source_dir=${2:?usage: hf_tokenizer_test.sh LLAMA3_HPC SOURCE_DIR}
skip() {
  echo "SKIP: $1"
  exit 77
}
[[ -n "${L3_LLAMA3_TOKENIZER:-}" && -n "${L3_TOKENIZER_GOLDEN:-}" ]] ||
  skip "L3_LLAMA3_TOKENIZER and L3_TOKENIZER_GOLDEN are not set (Meta's tokenizer is not redistributable)"
command -v node >/dev/null || skip "node is not installed"
[[ -d "${L3_NODE_MODULES:-}/@huggingface/tokenizers" && -d "${L3_NODE_MODULES:-}/@huggingface/jinja" ]] ||
  skip "L3_NODE_MODULES does not hold @huggingface/tokenizers and @huggingface/jinja (npm install them)"
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-hf-tokenizer-XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() {
  echo "FAIL [$1]"
  exit 1
}

# Conversations as users write them: a system prompt, stray whitespace around contents (the
# template trims it), several turns, Unicode, digits and code, a tool's result.
python3 - >chats.jsonl <<'PY'
import json
turns = [
    ("Reverse the word garden.", "  nedrag\n"),
    ("What is 12 + 30?", "42"),
    ("Écris « bonjour » en majuscules, s'il te plaît.", "BONJOUR"),
    ("Name three primes under 10.", "2, 3 and 5.\n\nAlso 7."),
    ("print the list [1, 2, 3] in Python", "```python\nprint([1, 2, 3])\n```"),
    ("日本語で「こんにちは」と言ってください。", "こんにちは！"),
]
for i, (question, answer) in enumerate(turns):
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if i % 2 == 0:
        messages.insert(0, {"role": "system", "content": " You are a careful assistant. "})
    if i == 3:
        messages += [{"role": "user", "content": "And the next one?"},
                     {"role": "assistant", "content": "11"}]
    print(json.dumps({"messages": messages}, ensure_ascii=False))
# A tool call and its result (Llama 3.1's "ipython" role), as grpo --environment renders them.
print(json.dumps({"messages": [
    {"role": "user", "content": "What is 12*7?"}, {"role": "assistant", "content": "calc 12*7"},
    {"role": "ipython", "content": " 84\n"}, {"role": "assistant", "content": "84"}]}))
PY
"$bin" prep sft --input chats.jsonl --tokenizer "$L3_LLAMA3_TOKENIZER" --output sft >prep.log 2>&1 ||
  fail "prep with Meta's tokenizer: $(tail -1 prep.log)"
"$bin" sft --model tiny-llama3 --data sft --seq-len 128 --global-batch 2 --steps 1 --ckpt-dir ck \
  --no-progress >sft.log 2>&1 || fail "sft on tiny-llama3: $(tail -1 sft.log)"
"$bin" export --ckpt ck --output hf >export.log 2>&1 || fail "export: $(tail -1 export.log)"
for file in tokenizer.json tokenizer_config.json special_tokens_map.json original/tokenizer.model; do
  [[ -f hf/$file ]] || fail "the export holds $file"
done
echo "ok   [the export holds tokenizer.json, tokenizer_config.json, special_tokens_map.json]"
python3 "$source_dir/tests/support/export_special_ids.py" hf 128000 >ids.log 2>&1 || fail "special-token ids: $(cat ids.log)"
echo "ok   [config.json and generation_config.json name Meta's special-token ids: $(cat ids.log)]"

# Real text: Meta's reference encodings, and every line of the docs through our tokenizer. Not
# the lines that spell a special token ("<|eot_id|>" in the docs' prose): llama3-hpc encodes such
# text in data as text, where Hugging Face's tokenizers match it as the special token.
cp "$L3_TOKENIZER_GOLDEN" texts.jsonl
grep -hv '^[[:space:]]*$' "$source_dir"/docs/*.md | grep -vF '<|' | python3 -c '
import json, sys
for line in sys.stdin:
    print(json.dumps({"text": line.rstrip("\n")}, ensure_ascii=False))' >docs.jsonl
"$bin" tokenize --tokenizer "$L3_LLAMA3_TOKENIZER" <docs.jsonl >docs-ids.jsonl || fail "tokenize the docs"
paste -d '\n' docs.jsonl docs-ids.jsonl | python3 -c '
import json, sys
lines = sys.stdin.read().split("\n")
for text, ids in zip(lines[0::2], lines[1::2]):
    if text:
        print(json.dumps({"text": json.loads(text)["text"], "ids": json.loads(ids)["ids"]}, ensure_ascii=False))' >>texts.jsonl
"$bin" tokenize --tokenizer "$L3_LLAMA3_TOKENIZER" --prep sft <chats.jsonl >prep-ids.jsonl ||
  fail "tokenize --prep sft"

mkdir -p check && cp "$source_dir/tests/data/hf_tokenizer_check.mjs" check/ &&
  ln -s "$L3_NODE_MODULES" check/node_modules
node check/hf_tokenizer_check.mjs hf texts.jsonl chats.jsonl prep-ids.jsonl || exit 1
echo "all HF tokenizer checks passed ($(wc -l <texts.jsonl) texts, $(wc -l <chats.jsonl) conversations)"
