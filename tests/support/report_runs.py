#!/usr/bin/env python3
"""Synthetic metrics files for the report's tests (tests/cli/report_test.sh,
tests/cli/report_chromium_test.sh), as the trainer writes them (docs/TRAINING.md):

  ROOT/a/metrics-sft.jsonl     started on 2 ranks, checkpointed at steps 20 and 40, a skipped
                               step (30), an evaluation at 25, killed after step 45 and resumed
                               after step 40 on 4 ranks (steps 41-45 written twice), a user's
                               note, evaluated and checkpointed at 60, a last line cut short
  ROOT/a/metrics-reward.jsonl  30 reward steps and an evaluation
  ROOT/b/metrics.jsonl         50 SFT steps of a version without "run" and "checkpoint" records

    report_runs.py ROOT        (ROOT/a and ROOT/b are created)
"""
import json
import math
import os
import sys

root = sys.argv[1]
os.makedirs(root + "/a", exist_ok=True)
os.makedirs(root + "/b", exist_ok=True)

def train(step, total, loss, **extra):
    r = {"kind": "train", "step": step, "total_steps": total, "epoch": 0, "loss": loss,
         "lr": 1e-3 * min(1, step / 10), "grad_norm": 1 + 0.3 * math.sin(step), "tokens": 4000,
         "tokens_per_s": 20000 + 500 * math.cos(step), "mfu": None, "data_wait_ms": 0.2,
         "step_ms": 200.0, "reduce_wait_ms": 0.1, "reduce_ms": 1, "gather_ms": 1,
         "gather_wait_ms": 1, "skipped": loss is None}
    r.update(extra)
    return r

def run(phase, step, total, resumed, ranks):
    return {"kind": "run", "phase": phase, "step": step, "total_steps": total, "ranks": ranks,
            "backend": "cpu", "model": "tiny", "parameters": 1235814, "trainable_parameters": 1235814,
            "resumed": resumed, "resumed_from": "ckpt/step-%08d" % step if resumed else None,
            "time": 1.7e9 + step, "host": "node1", "version": "0.1.0"}

def ckpt(step):
    return {"kind": "checkpoint", "step": step, "level": "global",
            "directory": "ckpt/step-%08d" % step, "seconds": 0.4, "time": 1.7e9 + step}

lines = [run("sft", 0, 60, False, 2)]
for s in range(1, 46):
    loss = None if s == 30 else 3 * math.exp(-s / 20) + 0.1 * math.sin(s)
    lines.append(train(s, 60, loss, loss_tokens=400))
    if s % 20 == 0:
        lines.append(ckpt(s))
    if s == 25:
        lines.append({"kind": "eval", "step": s, "loss": 1.5, "perplexity": math.exp(1.5),
                      "tokens": 900, "seconds": 0.5})
lines.append("note: node1 died here, resumed on 4 ranks")
lines.append(run("sft", 40, 60, True, 4))
for s in range(41, 61):
    lines.append(train(s, 60, 3 * math.exp(-s / 20), loss_tokens=400))
lines.append({"kind": "eval", "step": 60, "loss": 0.5, "perplexity": math.exp(0.5),
              "tokens": 900, "seconds": 0.5})
lines.append(ckpt(60))
with open(root + "/a/metrics-sft.jsonl", "w") as f:
    for l in lines:
        f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    f.write('{"kind":"train","step":61,"loss":0.')  # cut short by a crash

with open(root + "/a/metrics-reward.jsonl", "w") as f:
    f.write(json.dumps(run("reward", 0, 30, False, 2)) + "\n")
    for s in range(1, 31):
        f.write(json.dumps(train(s, 30, 0.7 * math.exp(-s / 10), accuracy=min(1, 0.5 + s / 40),
                                 margin=s / 10, pairs=16)) + "\n")
    f.write(json.dumps({"kind": "eval", "step": 30, "accuracy": 0.9, "margin": 3.1,
                        "reward_mean": 0.1, "reward_std": 2, "pairs": 64, "seconds": 0.3}) + "\n")

with open(root + "/b/metrics.jsonl", "w") as f:
    for s in range(1, 51):
        f.write(json.dumps(train(s, 50, 2.5 * math.exp(-s / 15), loss_tokens=400)) + "\n")
    f.write(json.dumps({"kind": "eval", "step": 50, "loss": 0.4, "perplexity": math.exp(0.4),
                        "tokens": 900, "seconds": 0.5}) + "\n")
