#!/usr/bin/env python3
"""Runs the shell commands of README.md and docs/*.md as written.

Every ```sh block must be preceded by a marker comment, invisible on the rendered page:

    <!-- doc-test: run [VAR=VALUE ...] [with=data,ckpt] [needs=meta-tokenizer] [; again VAR=VALUE ...] -->
    <!-- doc-test: skip REASON -->

`run` blocks are run in order, each file's in a directory of its own that holds the inputs the
docs name (chat.jsonl, pairs.jsonl, prefs.jsonl, sft.jsonl, prompts.jsonl, data/sft-*.jsonl.gz,
the demo's llama3-hpc-demo/input/{instructions,preferences,prompts}.jsonl, sft.ini, a
model directory standing for a Hugging Face download (the tiny model, its tokenizer the bytes
one), tokenizer.model when Meta's is given)
and build/bin/llama3-hpc (and examples/, the repository's), with llama3-hpc on PATH. VAR=VALUE sets a variable the block shows
(a size, the model directory) to the test's value: the block's own `VAR=...` lines are left
out, everything else runs as written ($MODEL_DIR in a value is that model directory).
`with=data` prepares data/sft, data/prefs and data/prefs-val first, `with=splits` sft/ and
pairs/ with train/ and val/ (README's names), `with=ckpt` ckpt/sft (SFT
from the model directory) and ckpt/rm (a reward model from it): the datasets and checkpoints
the docs' later commands start from. `needs=meta-tokenizer` skips the block without Meta's
tokenizer (L3_LLAMA3_TOKENIZER). `; again VAR=VALUE ...` runs the block once more, in a fresh
directory, with those values instead (README's block with a model download and without). `skip`
blocks say why they cannot run on a CPU machine in a test (a GPU, Slurm, Spack, a download, a
build). A block without a marker fails the test: every command is either run or accounted for.

    doc_commands_test.py LLAMA3_HPC SOURCE_DIR MPIEXEC [--only FILE]
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^<!--\s*doc-test:\s*(run|skip)\b(.*?)-->\s*$")


def blocks(path):
    """(line, marker kind, marker arguments, lines of the block) of every ```sh block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = []
    for i, line in enumerate(lines):
        if line.strip() != "```sh":
            continue
        body = []
        for j in range(i + 1, len(lines)):
            if lines[j].startswith("```"):
                break
            body.append(lines[j])
        marker = None
        for k in (i - 1, i - 2):
            if k >= 0 and MARKER.match(lines[k]):
                marker = MARKER.match(lines[k])
                break
        if marker is None:
            found.append((i + 1, None, "", body))
        else:
            found.append((i + 1, marker.group(1), marker.group(2).strip(), body))
    return found


def commands(body):
    """The block's commands: lines, with backslash continuations joined."""
    out, current = [], ""
    for line in body:
        current += line
        if line.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            out.append(current)
        current = ""
    return out


def write_inputs(work, tokenizer):
    """What the docs' commands read, in the current directory."""
    words = ["garden", "rocket", "planet", "silver", "winter", "castle", "forest", "bridge"]
    sft = []
    pairs = []
    for i in range(64):
        w = words[i % len(words)] + str(i)
        sft.append({"messages": [{"role": "user", "content": "Reverse the word %s." % w},
                                 {"role": "assistant", "content": w[::-1]}]})
        pairs.append({"prompt": "Reverse the word %s." % w, "chosen": w[::-1], "rejected": w})
    with open("chat.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in sft)
    with open("sft.jsonl", "w") as f:
        f.writelines(json.dumps({"prompt": r["messages"][0]["content"],
                                 "completion": r["messages"][1]["content"]}) + "\n" for r in sft)
    with open("prompts.jsonl", "w") as f:  # GRPO's: prompts with their exact answers
        f.writelines(json.dumps({"prompt": r["messages"][0]["content"],
                                 "answer": r["messages"][1]["content"]}) + "\n" for r in sft)
    for name in ("pairs.jsonl", "prefs.jsonl"):
        with open(name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in pairs)
    os.makedirs("data", exist_ok=True)
    for part in range(2):
        with gzip.open("data/sft-%04d.jsonl.gz" % part, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in sft[part::2])
    # What `llama3-hpc demo` writes as its input records (README's D), in the same formats.
    os.makedirs("llama3-hpc-demo/input", exist_ok=True)
    for name, records in (("instructions", sft), ("preferences", pairs)):
        with open("llama3-hpc-demo/input/%s.jsonl" % name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    shutil.copy("prompts.jsonl", "llama3-hpc-demo/input/prompts.jsonl")
    with open("sft.ini", "w") as f:
        f.write("model = tiny\ndata = sft-ini-data\nseq-len = 64\nglobal-batch = 4\nsteps = 4\n"
                "ckpt-dir = ckpt/sft-ini\nno-progress = true\n")
    if tokenizer:
        shutil.copy(tokenizer, "tokenizer.model")


def make_model(binary, work):
    """A small model directory in Hugging Face's layout, standing for a downloaded Llama, its
    tokenizer files included: the tiny model with the bytes tokenizer, so that the docs' runs
    take seconds (tests/data/hf_tokenizer_test.sh runs tiny-llama3 with Meta's tokenizer)."""
    model_dir = os.path.join(work, "base-model")
    model, tok = "tiny", "bytes"
    steps = [["prep", "sft", "--input", "chat.jsonl", "--tokenizer", tok, "--output", "base-data"],
             ["sft", "--model", model, "--data", "base-data", "--seq-len", "64", "--global-batch",
              "4", "--steps", "2", "--ckpt-dir", "base-ckpt", "--no-progress"],
             ["export", "--ckpt", "base-ckpt", "--output", model_dir, "--dtype", "fp32"]]
    for step in steps:
        subprocess.run([binary] + step, check=True, capture_output=True, cwd=work)
    subprocess.run([binary, "prep", "sft", "--input", "chat.jsonl", "--tokenizer", "bytes",
                    "--output", "sft-ini-data"], check=True, capture_output=True, cwd=work)
    return model_dir


def make_fixtures(binary, work, model_dir, wanted):
    """The datasets and checkpoints a block starts from (`with=`), made once per directory."""
    steps = []
    if "data" in wanted and not os.path.exists(os.path.join(work, "data", "sft")):
        steps += [["prep", "sft", "--input", "chat.jsonl", "--tokenizer", model_dir, "--output", "data/sft"],
                  ["prep", "preference", "--input", "pairs.jsonl", "--tokenizer", model_dir,
                   "--output", "data/prefs"],
                  ["prep", "preference", "--input", "prefs.jsonl", "--tokenizer", model_dir,
                   "--output", "data/prefs-val"]]
    if "splits" in wanted and not os.path.exists(os.path.join(work, "sft")):
        steps += [["prep", "sft", "--input", "chat.jsonl", "--tokenizer", model_dir, "--output", "sft",
                   "--val-fraction", "0.2"],
                  ["prep", "preference", "--input", "pairs.jsonl", "--tokenizer", model_dir,
                   "--output", "pairs", "--val-fraction", "0.2"]]
    if "ckpt" in wanted and not os.path.exists(os.path.join(work, "ckpt", "rm")):
        steps += [["prep", "sft", "--input", "chat.jsonl", "--tokenizer", model_dir, "--output", "fixture-sft"],
                  ["prep", "preference", "--input", "pairs.jsonl", "--tokenizer", model_dir,
                   "--output", "fixture-pairs"],
                  ["sft", "--init", model_dir, "--data", "fixture-sft", "--seq-len", "128",
                   "--global-batch", "4", "--steps", "2", "--ckpt-dir", "ckpt/sft", "--no-progress"],
                  ["reward", "--init", "ckpt/sft", "--data", "fixture-pairs", "--seq-len", "128",
                   "--global-batch", "4", "--steps", "2", "--ckpt-dir", "ckpt/rm", "--no-progress"]]
    for step in steps:
        subprocess.run([binary] + step, check=True, capture_output=True, cwd=work)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("source")
    parser.add_argument("mpiexec")
    parser.add_argument("--only", help="one file (README.md or docs/X.md)")
    a = parser.parse_args()
    binary = os.path.abspath(a.binary)
    tokenizer = os.environ.get("L3_LLAMA3_TOKENIZER") or ""
    files = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(a.source, "docs"))
                                   if f.endswith(".md"))
    if a.only:
        files = [a.only]
    root = tempfile.mkdtemp(prefix="l3-docs-")
    failures, ran, skipped = [], 0, 0
    env = dict(os.environ, L3_ERROR_GRACE_SECONDS="3", OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(binary) + os.pathsep + os.path.dirname(a.mpiexec) + os.pathsep + env["PATH"]

    def new_directory(path):
        """A directory with the docs' inputs and build/bin/llama3-hpc."""
        os.makedirs(os.path.join(path, "build", "bin"))
        os.symlink(binary, os.path.join(path, "build", "bin", "llama3-hpc"))
        # The repository's examples (environments, ...), as the docs' commands from its root see them.
        os.symlink(os.path.join(os.path.abspath(a.source), "examples"), os.path.join(path, "examples"))
        cwd = os.getcwd()
        os.chdir(path)
        write_inputs(path, tokenizer)
        os.chdir(cwd)

    def run_block(where, work, model_dir, assigned, wanted, body):
        nonlocal ran
        make_fixtures(binary, work, model_dir, wanted)
        values = {k: v.replace("$MODEL_DIR", model_dir) for k, v in assigned.items()}
        script = [c for c in commands(body)
                  if not any(re.match(r"^\s*%s=" % re.escape(k), c) for k in values)]
        text = "set -eo pipefail\n" + "".join(
            "export %s=%s\n" % (k, v) for k, v in values.items()) + "\n".join(script) + "\n"
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True,
                                  text=True, errors="replace", timeout=600)
            code, out = done.returncode, (done.stdout + done.stderr)
        except subprocess.TimeoutExpired:
            code, out = "time-out", ""
        ran += 1
        if code != 0:
            failures.append("%s: exit %s\n%s\n  output: %s" % (
                where, code, text, out.strip()[-1500:]))
            print("FAIL %s (exit %s)" % (where, code), flush=True)
        else:
            print("ok   %s (%d commands, %.0f s)" % (where, len(script), time.monotonic() - started),
                  flush=True)

    try:
        for name in files:
            found = blocks(os.path.join(a.source, name))
            if not found:
                continue
            work = os.path.join(root, name.replace("/", "_"))
            new_directory(work)
            model_dir = None
            for line, kind, args, body in found:
                where = "%s:%d" % (name, line)
                if kind is None:
                    failures.append(where + ": no doc-test marker (run or skip, with the reason)")
                    continue
                if kind == "skip":
                    if not args:
                        failures.append(where + ": skip without a reason")
                    skipped += 1
                    continue
                first, *agains = [part.strip() for part in args.split(";")]
                words = first.split()
                if "needs=meta-tokenizer" in words and not tokenizer:
                    print("SKIP %s: needs Meta's tokenizer (L3_LLAMA3_TOKENIZER)" % where)
                    skipped += 1
                    continue
                assigned = dict(w.split("=", 1) for w in words
                                if "=" in w and not w.startswith(("with=", "needs=")))
                wanted = next((w[5:].split(",") for w in words if w.startswith("with=")), [])
                if model_dir is None:
                    model_dir = make_model(binary, work)
                run_block(where, work, model_dir, assigned, wanted, body)
                for n, again in enumerate(agains, 1):
                    if not again.startswith("again "):
                        failures.append(where + ": '%s' after ';' (write: again VAR=VALUE ...)" % again)
                        continue
                    other = os.path.join(root, "%s-again-%d-%d" % (name.replace("/", "_"), line, n))
                    new_directory(other)
                    values = dict(assigned, **dict(w.split("=", 1) for w in again.split()[1:]))
                    run_block("%s (again %s)" % (where, again[6:]), other, model_dir,
                              values, wanted, body)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    print("%d blocks run, %d skipped (with their reasons), %d failures" % (ran, skipped, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
