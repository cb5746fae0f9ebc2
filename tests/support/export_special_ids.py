#!/usr/bin/env python3
"""The special-token ids a Hugging Face export names in config.json and generation_config.json
are those of the tokenizer files it holds: bos is <|begin_of_text|>, eos <|end_of_text|>,
<|eom_id|> and <|eot_id|>, pad <|finetune_right_pad_id|>, looked up in tokenizer.json's
added_tokens and tokenizer_config.json's added_tokens_decoder (which must agree).
    export_special_ids.py EXPORT_DIR [EXPECTED_BOS]
Prints the ids; exits 1 with the first mismatch."""
import json
import sys
from pathlib import Path

export = Path(sys.argv[1])
config = json.loads((export / "config.json").read_text())
added = {t["content"]: t["id"] for t in json.loads((export / "tokenizer.json").read_text())["added_tokens"]}
decoder = json.loads((export / "tokenizer_config.json").read_text())["added_tokens_decoder"]
decoder = {v["content"]: int(k) for k, v in decoder.items()}
names = ("<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>", "<|finetune_right_pad_id|>")
ids = {}
for name in names:
    if added.get(name) is None or added.get(name) != decoder.get(name):
        sys.exit(f"FAIL: {name} is {added.get(name)} in tokenizer.json, {decoder.get(name)} in tokenizer_config.json")
    ids[name] = added[name]
want = {"bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]],
        "pad_token_id": ids["<|finetune_right_pad_id|>"]}
files = [("config.json", config)]
if (export / "generation_config.json").exists():
    files.append(("generation_config.json", json.loads((export / "generation_config.json").read_text())))
for file, values in files:
    for key, value in want.items():
        if values.get(key) != value:
            sys.exit(f"FAIL: {file} says {key} {values.get(key)}, the exported tokenizer {value}")
if len(sys.argv) > 2 and want["bos_token_id"] != int(sys.argv[2]):
    sys.exit(f"FAIL: bos is {want['bos_token_id']}, expected {sys.argv[2]}")
if config["vocab_size"] <= max(ids.values()):
    sys.exit(f"FAIL: vocab_size {config['vocab_size']} does not hold id {max(ids.values())}")
print(" ".join(f"{k}={v}" for k, v in want.items()), "in", ", ".join(f for f, _ in files))
