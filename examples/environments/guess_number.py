#!/usr/bin/env python3
"""Guess the number, a game of several user turns for `llama3-hpc grpo --environment`
(docs/TRAINING.md, "Multi-turn episodes"). Records:
{"prompt": "I am thinking of a number from 1 to 100. Guess it: answer with a number only.",
 "answer": 37}.

Each policy turn is a guess. Right: the episode ends with reward 1 - 0.1 x (guesses before it),
at least 0.1. Wrong: the user answers "higher" or "lower" (or "a number, please" for a turn
that is not one) and the policy guesses again; wrong when no turn is left ("final"): reward 0.
Deterministic, as an environment must be for a run to be reproducible.
"""
import json
import re
import sys


def answer(request):
    secret = int(request["record"]["answer"])
    guess = re.fullmatch(r"\s*(-?\d+)\s*\.?\s*", request["messages"][-1]["content"])
    if guess and int(guess.group(1)) == secret:
        return {"reward": max(0.1, 1.0 - 0.1 * (request["turn"] - 1))}
    if request["final"]:
        return {"reward": 0.0}
    if not guess:
        reply = "a number, please"
    else:
        reply = "higher" if int(guess.group(1)) < secret else "lower"
    return {"messages": [{"role": "user", "content": reply}]}


for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps({**answer(request), "id": request["id"]}), flush=True)
