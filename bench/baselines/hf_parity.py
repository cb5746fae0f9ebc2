#!/usr/bin/env python3
"""Numerical parity with Hugging Face transformers on identical weights (the one-shot GPU check's
parity stage; the node's python3 has torch and transformers, the build machines do not).

For two small models with the features of the Llama 3 family (a Llama-3.2-style one with tied
embeddings and llama3 RoPE scaling, a Llama-3-style one untied without scaling; GQA in both):
  1. `llama3-hpc demo --model CONFIG` trains them (SFT, then a reward model) on the CPU;
  2. `llama3-hpc export --dtype fp32` writes both checkpoints as Hugging Face models;
  3. `llama3-hpc generate --json --logprobs` answers a prompt greedily and reports the token ids
     and the log-probability of each prompt token (after the first) and each new token;
     `llama3-hpc score --json` scores a response and reports the ids it scored;
  4. transformers loads the exports (LlamaForCausalLM, LlamaForSequenceClassification; fp32, on
     the CPU) and runs the same ids: every new token must be its greedy choice too (or within
     1e-4 of it: a tie within rounding), every log-probability within 1e-3 of ours, and the
     reward within 1e-3 (relative to max(1, |r|)).
The second variant trains its reward model as LoRA adapters (`demo --lora`): its export is
`export --merge` (the adapters folded into the SFT model), and, where the node's python3 has
peft, `PeftModel.from_pretrained` loads `export --adapter`'s directory on the exported SFT model
(as LlamaForSequenceClassification) and must give the same reward (within 1e-3).

  python3 hf_parity.py [--llama3-hpc BIN] [--workdir DIR] [--json FILE]
                       [--sft-steps N] [--reward-steps N]   (training of the demo, 200 and 100)
Exit 0 when every check passed, 1 when one failed, 77 when torch/transformers are missing (the
llama3-hpc side still runs and is reported: that is what the rehearsal on a build machine checks).
"""
import argparse
import json
import math
import os
import subprocess
import sys

BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=64,
            intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-5,
            rope_theta=500000.0, hidden_act="silu", torch_dtype="float32")
VARIANTS = {
    "llama3.2-style (tied, llama3 RoPE scaling)": dict(
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama3-style (untied, no scaling; LoRA reward model)": dict(tie_word_embeddings=False,
                                                                rope_scaling=None),
}
PROMPT = "Reverse word12x3."
RESPONSE = "3x21drow"
TOLERANCE = 1e-3


def run(cmd, log):
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
        f.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} exited {done.returncode} (see {log})")
    return done.stdout


def last_json_line(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def ours(binary, variant, settings, workdir, log, steps):
    """llama3-hpc's side: train, export, generate, score."""
    work = os.path.join(workdir, variant.split()[0])
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump({**BASE, **settings}, f, indent=2)
    demo = os.path.join(work, "demo")
    lora = "LoRA" in variant
    run([binary, "demo", "--workdir", demo, "--model", config, "--sft-steps", str(steps[0]),
         "--reward-steps", str(steps[1]), "--dpo-steps", "0", "--log-level", "warn"]
        + (["--lora"] if lora else []), log)
    row = {"variant": variant}
    for phase in ("sft", "reward"):
        export = os.path.join(work, f"hf-{phase}")
        merge = ["--merge"] if lora and phase == "reward" else []
        run([binary, "export", "--ckpt", os.path.join(demo, "ckpt", phase), "--output", export,
             "--dtype", "fp32", "--overwrite"] + merge, log)
        row[f"export_{phase}"] = export
    if lora:
        adapter = os.path.join(work, "peft-reward")
        run([binary, "export", "--ckpt", os.path.join(demo, "ckpt", "reward"), "--adapter",
             "--output", adapter, "--overwrite"], log)
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            if json.load(f).get("task_type") != "SEQ_CLS":
                raise RuntimeError(f"{adapter}: not a SEQ_CLS adapter")
        row["adapter_reward"] = adapter
    generated = last_json_line(run(
        [binary, "generate", "--init", os.path.join(demo, "ckpt", "sft"), "--prompt", PROMPT,
         "--chat", "--max-new", "12", "--json", "--logprobs", "--log-level", "warn"], log))
    scored = last_json_line(run(
        [binary, "score", "--init", os.path.join(demo, "ckpt", "reward"), "--prompt", PROMPT,
         "--response", RESPONSE, "--json", "--log-level", "warn"], log))
    row.update(prompt_ids=generated["prompt_ids"], new_ids=generated["new_ids"],
               logprobs=generated["logprobs"], prompt_logprobs=generated["prompt_logprobs"],
               text=generated["text"], score_ids=scored["ids"], reward=scored["reward"])
    if (len(row["new_ids"]) != len(row["logprobs"])
            or len(row["prompt_logprobs"]) != len(row["prompt_ids"]) - 1 or len(row["prompt_ids"]) < 2):
        raise RuntimeError(f"generate reported {len(row['prompt_ids'])} prompt ids with "
                           f"{len(row['prompt_logprobs'])} log-probabilities, "
                           f"{len(row['new_ids'])} new ids with {len(row['logprobs'])}")
    return row


def theirs(row):
    """transformers' side on the same ids; adds the comparison to the row."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.set_grad_enabled(False)
    lm = AutoModelForCausalLM.from_pretrained(row["export_sft"]).float().eval()
    ids = row["prompt_ids"] + row["new_ids"]
    logits = lm(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    # The logits at position p score token p + 1: the prompt's from position 0, the new
    # tokens' from the prompt's last position.
    hf_prompt = [float(logp[p - 1, ids[p]]) for p in range(1, len(row["prompt_ids"]))]
    start = len(row["prompt_ids"]) - 1
    hf = [float(logp[start + t, token]) for t, token in enumerate(row["new_ids"])]
    # Our token is transformers' greedy choice, or within 1e-4 of it (a tie within rounding).
    ties = [float(logp[start + t].max()) - hf[t] for t in range(len(hf))]
    greedy = all(gap < 1e-4 for gap in ties)
    diff = max(abs(a - b) for a, b in zip(row["prompt_logprobs"] + row["logprobs"], hf_prompt + hf))
    rm = AutoModelForSequenceClassification.from_pretrained(row["export_reward"]).float().eval()
    reward_hf = float(rm(torch.tensor([row["score_ids"]])).logits[0, 0])
    reward_diff = abs(reward_hf - row["reward"]) / max(1.0, abs(reward_hf))
    row.update(logprobs_hf=hf, prompt_logprobs_hf=hf_prompt, logprob_max_abs_diff=diff,
               greedy_agrees=greedy, greedy_max_gap=max(ties, default=0.0), reward_hf=reward_hf,
               reward_rel_diff=reward_diff)
    peft_ok = True
    if "adapter_reward" in row:
        peft_ok = peft_parity(row)
    row["passed"] = bool(greedy and diff < TOLERANCE and reward_diff < TOLERANCE
                         and math.isfinite(diff) and math.isfinite(reward_diff) and peft_ok)


def peft_parity(row):
    """PEFT loads our adapter on the exported SFT model; its reward must be ours. True when it is
    or when peft is not installed (said in the row)."""
    try:
        import peft
    except ImportError as e:
        row["peft"] = f"not installed ({e})"
        return True
    import torch
    from transformers import AutoModelForSequenceClassification

    base = AutoModelForSequenceClassification.from_pretrained(row["export_sft"], num_labels=1)
    model = peft.PeftModel.from_pretrained(base.float(), row["adapter_reward"]).eval()
    reward = float(model(input_ids=torch.tensor([row["score_ids"]])).logits[0, 0])
    rel = abs(reward - row["reward"]) / max(1.0, abs(reward))
    row.update(peft=peft.__version__, reward_peft=reward, reward_peft_rel_diff=rel)
    return math.isfinite(rel) and rel < TOLERANCE


def write_json(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama3-hpc", default="llama3-hpc")
    ap.add_argument("--workdir", default="hf-parity")
    ap.add_argument("--json")
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--reward-steps", type=int, default=100)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    log = os.path.join(a.workdir, "llama3-hpc.log")
    doc = {"tolerance": TOLERANCE, "rows": []}
    try:
        import torch
        import transformers
        doc.update(torch=torch.__version__, transformers=transformers.__version__)
        have_hf = True
    except ImportError as e:
        doc["skipped"] = f"no torch/transformers here ({e})"
        have_hf = False
    failed = False
    for variant, settings in VARIANTS.items():
        try:
            row = ours(a.llama3_hpc, variant, settings, a.workdir, log,
                       (a.sft_steps, a.reward_steps))
            if have_hf:
                theirs(row)
                failed |= not row["passed"]
        except Exception as e:  # one variant's failure is reported, the other still runs
            row = {"variant": variant, "passed": False, "error": f"{type(e).__name__}: {e}"}
            failed = True
        doc["rows"].append(row)
        brief = {k: row.get(k) for k in ("variant", "passed", "logprob_max_abs_diff",
                                           "greedy_agrees", "reward", "reward_hf", "reward_peft",
                                           "peft", "error")}
        print(json.dumps({k: v for k, v in brief.items() if v is not None}), flush=True)
        if a.json:  # after every variant: a time limit that stops the next keeps this one's
            write_json(a.json, doc)
    if a.json:
        write_json(a.json, doc)
    if failed:
        return 1
    return 0 if have_hf else 77


if __name__ == "__main__":
    sys.exit(main())
