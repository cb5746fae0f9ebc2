#!/usr/bin/env python3
"""A calculator tool for `llama3-hpc grpo --environment` (docs/TRAINING.md, "Multi-turn
episodes"). Records: {"prompt": "What is 12*7?", "answer": "84"}.

The policy may call the tool by writing a turn of the form `calc EXPRESSION` (integers, + - *
/ and parentheses): the environment answers with the value as a tool result (role "ipython"),
and the policy takes another turn. Any other turn is the policy's answer, and ends the episode:
reward 1 when it equals the record's "answer" (both stripped), else 0. A turn that is a call
when no turn is left ("final") scores 0. Deterministic: the same conversation always gets the
same answer, so a run and its rerun (or a resumed run) see the same episodes.
"""
import ast
import json
import sys
from fractions import Fraction

OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
             ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def value(node):
    """The value of an arithmetic expression's tree; ValueError for anything else."""
    if isinstance(node, ast.Expression):
        return value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        if abs(left) > 10**30 or abs(right) > 10**30:
            raise ValueError("number too large")
        return OPERATORS[type(node.op)](left, right)
    raise ValueError("not an arithmetic expression")


def calculate(expression):
    try:
        result = value(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, RecursionError) as error:
        return f"error: {error}"
    if result.denominator == 1:
        return str(result.numerator)
    return f"{float(result):.6g}"


def answer(request):
    turn = request["messages"][-1]["content"].strip()
    if turn.startswith("calc "):
        if request["final"]:
            return {"reward": 0.0}
        return {"messages": [{"role": "ipython", "content": calculate(turn[5:])}]}
    expected = str(request["record"]["answer"]).strip()
    return {"reward": 1.0 if turn == expected else 0.0}


for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps({**answer(request), "id": request["id"]}), flush=True)
