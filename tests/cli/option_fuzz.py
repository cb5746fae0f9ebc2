#!/usr/bin/env python3
"""Drives the CLI with random option values: a few hundred runs of tiny models and datasets.

Every run must end with a documented exit code (0 done, 2 bad usage or input, 75 checkpointed
before a --deadline; 1, an internal error, fails the test, as does a signal or a time-out), a
refusal must be exactly one "error:" line, and nothing may be written outside the directories
the run was given: the inputs and a "canary" directory (the target of links planted among the
outputs, and itself offered as an output to replace) must be unchanged after every run.

    option_fuzz.py LLAMA3_HPC MPIEXEC [--runs N] [--seed S] [--keep]

The seed is printed: --seed S, else $L3_TEST_SEED (a number, or "random" for a fresh one), else
the fixed default that CI uses; a failure prints the command line to rerun.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from test_seed import test_seed  # noqa: E402

DOCUMENTED = {0, 2, 75}

# Numbers that probe every domain: zero, signs, fractions, huge, not finite, not numbers.
NUMBERS = ["0", "1", "2", "3", "-1", "0.5", "1e-3", "64.5", "1e9", "16000000", "16777217",
           "9223372036854775807", "-9223372036854775808", "18446744073709551616", "1e400",
           "inf", "-inf", "nan", "abc", "", "0x10", " 7", "1,5"]
SMALL_COUNTS = ["1", "2", "1", "2", "0", "-1", "9223372036854775807", "x"]
RATES = ["1e-3", "1e-3", "1e-2", "0", "-1e-3", "inf", "nan", "1e30", "abc"]


class Sandbox:
    """The directories of the fuzz: inputs (read only), canary (never written), out/run-N."""

    def __init__(self, root, binary, mpiexec):
        self.root = root
        self.bin = binary
        self.mpiexec = mpiexec
        self.inputs = os.path.join(root, "inputs")
        self.canary = os.path.join(root, "canary")
        self.out = os.path.join(root, "out")
        for d in (self.inputs, self.canary, self.out):
            os.makedirs(d)
        with open(os.path.join(self.canary, "victim"), "w") as f:
            f.write("precious\n")

    def input(self, name):
        return os.path.join(self.inputs, name)

    def prepare(self):
        with open(self.input("train.jsonl"), "w") as f:
            for i in range(40):
                f.write('{"prompt":"Reverse word%d.","completion":"%s"}\n' % (i, ("word%d" % i)[::-1]))
        with open(self.input("pairs.jsonl"), "w") as f:
            for i in range(16):
                w = "w%d" % i
                f.write('{"prompt":"Reverse %s.","chosen":"%s","rejected":"%s"}\n' % (w, w[::-1], w))
        open(self.input("empty.model"), "w").close()
        os.mkfifo(self.input("fifo"))  # read as a file, it would block forever: refused at once
        with open(self.input("deep.json"), "w") as f:  # JSON nested 100,000 levels (200 KB)
            f.write('{"hidden_size": ' + "[" * 100000 + "]" * 100000 + "}")
        with open(self.input("run.ini"), "w") as f:
            f.write("log-every = 1\n")
        steps = [
            ["prep", "sft", "--input", self.input("train.jsonl"), "--tokenizer", "bytes",
             "--output", self.input("ds"), "--val-fraction", "0.2"],
            ["prep", "preference", "--input", self.input("pairs.jsonl"), "--tokenizer", "bytes",
             "--output", self.input("pairs")],
            ["sft", "--model", "tiny", "--data", self.input("ds/train"), "--seq-len", "64",
             "--global-batch", "2", "--steps", "2", "--ckpt-dir", self.input("ck"), "--no-progress"],
            ["export", "--ckpt", self.input("ck"), "--output", self.input("hf"), "--dtype", "fp32"],
        ]
        for args in steps:
            subprocess.run([self.bin] + args, check=True, capture_output=True, cwd=self.root)

    def snapshot(self):
        """Everything outside out/: paths, types, sizes, modification times."""
        seen = {}
        for top in (self.inputs, self.canary):
            for dirpath, dirnames, filenames in os.walk(top):
                for name in dirnames + filenames:
                    p = os.path.join(dirpath, name)
                    st = os.lstat(p)
                    seen[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
        seen["(top)"] = tuple(sorted(os.listdir(self.root)))
        return seen


class Generator:
    """Random command lines. Half the runs are meant to work (every choice from its valid list),
    the others are hostile (each choice from its invalid list with probability 0.3). Paths point
    into the run's own directory, the inputs, or traps."""

    def __init__(self, rng, box, run_dir):
        self.rng = rng
        self.box = box
        self.dir = run_dir
        self.hostile = rng.random() < 0.5

    def maybe(self, p=0.3):
        return self.rng.random() < p

    def pick(self, valid, invalid=()):
        if invalid and self.hostile and self.maybe(0.3):
            return self.rng.choice(list(invalid))
        return self.rng.choice(list(valid))

    def number(self, valid):
        return self.pick(valid, NUMBERS)

    def output_path(self):
        return self.pick(["new", "new/", "./new/.", os.path.join(self.dir, "deep/er")],
                         [".", "..", "", "/", self.box.canary, self.box.canary + "/",
                          "link-to-canary", "file", "file/sub", "/dev/null"])

    def dataset(self, kind):
        own = self.box.input("ds/train") if kind == "sft" else self.box.input("pairs")
        other = self.box.input("pairs") if kind == "sft" else self.box.input("ds/train")
        return self.pick([own], [other, self.box.input("ds"), "missing", "", self.box.canary,
                                 self.box.input("fifo")])

    def model(self):
        return self.pick([self.box.input("ck"), self.box.input("hf")],
                         ["missing", "", self.box.canary, self.box.input("ds"),
                          self.box.input("fifo")])

    def training(self, phase):
        args = [phase]
        if phase == "sft":
            args += ["--model", self.pick(["tiny"], ["llama9", self.box.input("hf/config.json"),
                                                     "/dev/zero", self.box.canary,
                                                     self.box.input("fifo"),
                                                     self.box.input("deep.json")])]
            if self.maybe(0.2):
                args += ["--init", self.pick([self.box.input("ck")], [self.box.input("hf"), "missing"])]
        else:
            args += ["--init", self.model()]
        args += ["--data", self.dataset("sft" if phase == "sft" else "preference")]
        args += ["--seq-len", self.number(["128"] if phase == "dpo" else ["64", "32"])]
        args += ["--global-batch", self.number(["2", "4"])]
        if self.maybe():
            args += ["--micro-batch", self.number(["1", "2"])]
        if self.maybe(0.8):
            args += ["--steps", self.pick(["1", "2", "3"], SMALL_COUNTS)]
        elif self.maybe(0.5):
            args += ["--epochs", self.pick(["1", "2"], SMALL_COUNTS + ["10001"])]
        else:
            args += ["--steps", "1"]
        for option, valid, invalid in [
                ("--lr", ["1e-3", "1e-2", "0"], RATES), ("--min-lr", ["1e-4", "0"], RATES),
                ("--warmup", ["0", "1"], SMALL_COUNTS), ("--weight-decay", ["0", "0.1"], RATES),
                ("--beta1", ["0.9", "0"], ["1", "-0.1", "nan"]), ("--beta2", ["0.95"], ["1", "2"]),
                ("--adam-eps", ["1e-8"], ["0", "-1", "inf"]),
                ("--grad-clip", ["1", "0"], ["-1", "nan"]),
                ("--seed", ["1", "18446744073709551615"], ["-1", "x"]),
                ("--log-every", ["0", "1"], SMALL_COUNTS), ("--eval-every", ["0", "1"], SMALL_COUNTS),
                ("--max-bad-steps", ["1", "5"], SMALL_COUNTS),
                ("--prefetch-depth", ["1", "2"], ["0", "65"]), ("--bucket-mb", ["1"], ["0", "inf"]),
                ("--keep-last", ["2", "3"], ["1"]), ("--peak-tflops", ["0", "1"], ["-1", "nan"]),
                ("--deadline-margin", ["0", "60"], ["nan"]), ("--device", ["-1", "99"], ["-2"])]:
            if self.maybe(0.1):
                args += [option, self.pick(valid, invalid)]
        if self.maybe(0.3):
            args += ["--val-data", self.dataset("sft" if phase == "sft" else "preference")]
        # LoRA: its options with --lora-rank, or (hostile) without it: refused, never ignored.
        lora = self.maybe(0.15)
        if lora:
            args += ["--lora-rank", self.pick(["2", "4"], ["0", "-1", "65537"])]
        if lora or (self.hostile and self.maybe(0.1)):
            for option, valid, invalid in [("--lora-alpha", ["16", "8"], ["0", "1e39", "nan"]),
                                           ("--lora-targets", ["q,v", "all"], ["lm_head", ""]),
                                           ("--lora-dropout", ["0", "0.1"], ["1", "-0.1"])]:
                if self.maybe(0.4):
                    args += [option, self.pick(valid, invalid)]
        if phase == "dpo":
            for option, valid, invalid in [("--beta", ["0.1", "0.5"], ["0", "1e300", "1e-30", "-1"]),
                                           ("--loss", ["sigmoid", "ipo"], ["hinge", ""]),
                                           ("--label-smoothing", ["0", "0.1"], ["0.5", "nan"])]:
                if self.maybe(0.3):
                    args += [option, self.pick(valid, invalid)]
            if self.maybe(0.2):
                args += ["--reference-dir", self.pick(["ref", "ref/"],
                                                      ["file", "link-to-canary", "", self.box.canary])]
        if self.maybe(0.4):
            args += ["--ckpt-dir", self.pick(["ck", "new-ck"], ["file", "file/ck", "/dev/null", ""])]
            if self.maybe(0.4):
                args += ["--checkpoint-every", self.number(["1", "2"])]
            if self.maybe(0.2):
                args += ["--deadline", self.pick(["1", "3600"], ["2020-01-01T00:00Z", "inf", "soon",
                                                               "2030-02-30T00:00Z",
                                                               "2031-02-29T12:00Z"])]
            if self.maybe(0.2):
                args += ["--resume", self.pick(["auto", self.box.input("ck")], ["none", "missing", ""])]
        # The node-local level: its options with --ckpt-local (and --ckpt-dir), or without it.
        if self.maybe(0.1):
            if "--ckpt-dir" in args or self.hostile:
                args += ["--ckpt-local", self.pick(["local", "local-%h"],
                                                   ["link-to-canary", "file", ""]),
                         "--checkpoint-every-local", self.number(["1", "2"])]
            for option, valid, invalid in [("--ckpt-redundancy", ["partner", "none"], ["raid5"]),
                                           ("--flush-every", ["0", "2"], SMALL_COUNTS),
                                           ("--ckpt-xor-set", ["2", "4"], ["1", "1025"])]:
                if self.maybe(0.3):
                    args += [option, self.pick(valid, invalid)]
        if self.maybe(0.3):
            args += ["--metrics", self.pick(["m.jsonl", "sub/m.jsonl"],
                                            ["link-to-victim.jsonl", ".", "file/m.jsonl", "",
                                             self.box.input("fifo"), "fifo-out",
                                             "hard-link-to-victim", "/dev/null"])]
        if self.maybe(0.1):
            args += ["--tensorboard", self.pick(["tb", "sub/tb"],
                                                ["/", "//", "link-to-canary", "file", "/dev/null"])]
        if self.maybe(0.05):
            args += ["--progress", self.pick(["never", "auto"], ["bogus", ""])]
        if self.maybe(0.1):
            args += ["--dry-run-memory"]
            if self.maybe():
                args += ["--dry-run-ranks", self.number(["8", "64"])]
        for flag in ["--recompute", "--shard-gradients", "--no-shard-optimizer", "--drop-long"]:
            if self.maybe(0.1):
                args.append(flag)
        if phase == "reward" and self.maybe(0.2):
            args += ["--center-rewards", self.pick(["0", "0.01"], RATES)]
        if self.maybe(0.1):
            args += ["--config", self.pick([self.box.input("run.ini")],
                                           ["/dev/zero", ".", "missing", self.box.input("fifo")])]
        return args + ["--no-progress"]

    def command(self):
        r = self.rng
        kind = r.choices(["sft", "reward", "dpo", "eval", "generate", "score", "prep", "export",
                          "ckpt", "tokenize"], weights=[28, 12, 8, 10, 10, 5, 12, 10, 5, 3])[0]
        if kind in ("sft", "reward", "dpo"):
            return self.training(kind)
        if kind == "eval":
            args = ["eval", "--init", self.model(), "--data", self.dataset("sft")]
            if self.maybe(0.6):
                args += ["--micro-batch", self.number(["1", "4"])]
            if self.maybe(0.4):
                args += ["--seq-len", self.number(["64", "16"])]
            if self.hostile and self.maybe(0.1):
                args += ["--seq-len", self.pick(["16777216", "8193"])]  # beyond the model's positions
            return args
        if kind in ("generate", "score"):
            args = [kind, "--init", self.model(),
                    "--tokenizer", self.pick(["bytes"], [self.box.input("empty.model"), "nope"])]
            if kind == "generate" and self.maybe(0.4):
                # A batch job: its output and progress files follow the output rule (a regular
                # file with one name, or nothing yet).
                args += ["--input", self.pick([self.box.input("train.jsonl")],
                                              [self.box.input("fifo"), "missing.jsonl"]),
                         "--output", self.pick(["gen.jsonl", "sub.gen.jsonl"],
                                               ["link-to-victim.jsonl", "fifo-out", "/dev/null",
                                                ".", "hard-link-to-victim", "file/x.jsonl",
                                                "n" * 300, "link-to-canary"])]
                if self.maybe(0.3):
                    args += ["--num-samples", self.pick(["1", "2"], SMALL_COUNTS)]
            elif kind == "generate":
                args += ["--prompt", self.pick(["Reverse word1.", ""], ["x" * 3000])]
                for option, valid, invalid in [
                        ("--max-new", ["0", "4"], ["-1", "4096", "16777217"]),
                        ("--temperature", ["0", "0.7"], RATES), ("--top-p", ["1", "0.5"], ["0", "2"]),
                        ("--seed", ["0", "7"], ["-1"])]:
                    if self.maybe(0.4):
                        args += [option, self.pick(valid, invalid)]
            else:
                args += ["--prompt", "q", "--response", "a"]
            return args
        if kind == "prep":
            which = self.pick(["sft", "preference"], ["other"])
            data = self.box.input("train.jsonl" if which == "sft" else "pairs.jsonl")
            args = ["prep", which,
                    "--input", self.pick([data], [self.box.input("*.jsonl"), "missing.jsonl",
                                                  "/dev/zero", self.box.inputs]),
                    "--tokenizer", self.pick(["bytes"], [self.box.input("empty.model"), "nope"]),
                    "--output", self.output_path()]
            for option, valid, invalid in [("--val-fraction", ["0.2", "0"], ["1", "-0.1", "nan"]),
                                           ("--max-len", ["0", "16"], ["-1"]),
                                           ("--shard-tokens", ["100", "1000000"], ["0", "1e12"]),
                                           ("--seed", ["1"], ["-1"])]:
                if self.maybe(0.3):
                    args += [option, self.pick(valid, invalid)]
            if self.maybe(0.5):
                args.append("--overwrite")
            return args
        if kind == "export":
            args = ["export", "--ckpt", self.pick([self.box.input("ck")], ["missing", self.box.canary]),
                    "--output", self.output_path()]
            if self.maybe(0.5):
                args.append("--overwrite")
            if self.maybe(0.4):
                args += ["--dtype", self.pick(["bf16", "fp32"], ["fp16"])]
            if self.maybe(0.3):
                args += ["--shard-size", self.pick(["5GB", "100KB"], ["0", "x", "99999999999999GB"])]
            return args
        if kind == "ckpt":
            action = self.pick(["list", "verify", "prune"], ["other"])
            target = self.pick([self.box.input("ck"), "ck-copy"], ["missing", self.box.canary, "."])
            if action == "prune" and target == self.box.input("ck"):
                target = "ck-copy"  # pruning is a write: only a copy of ours
            args = ["ckpt", action, target]
            if self.maybe(0.3):
                args += ["--keep-last", self.pick(["2", "3"], ["1", "-1"])]
            return args
        return ["tokenize", "--tokenizer", self.pick(["bytes"], [self.box.input("empty.model"), "nope",
                                                                self.box.input("fifo"),
                                                                self.box.input("deep.json")])]


def prepare_run_dir(box, run_dir):
    """The run's own directory, with traps: links to the canary where outputs may go."""
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "file"), "w") as f:
        f.write("a file, not a directory\n")
    victim = os.path.join(box.canary, "victim")
    os.symlink(box.canary, os.path.join(run_dir, "link-to-canary"))
    os.symlink(victim, os.path.join(run_dir, "link-to-victim.jsonl"))
    os.link(victim, os.path.join(run_dir, "hard-link-to-victim"))  # a second name of the victim
    os.mkfifo(os.path.join(run_dir, "fifo-out"))  # written to, it would block
    ck = os.path.join(run_dir, "ck")
    os.makedirs(ck)
    for name in ("latest.tmp", "manifest.json.tmp", "step-00000001.partial"):
        os.symlink(victim, os.path.join(ck, name))
    shutil.copytree(box.input("ck"), os.path.join(run_dir, "ck-copy"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("mpiexec")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--report", action="store_true",
                        help="list the most frequent refusals (to tune the generator)")
    a = parser.parse_args()
    if a.seed is None:
        a.seed = test_seed(20261202)
    binary = os.path.abspath(a.binary)
    print("option fuzz: %d runs, seed %d" % (a.runs, a.seed), flush=True)
    rng = random.Random(a.seed)
    root = tempfile.mkdtemp(prefix="l3-fuzz-")
    env = dict(os.environ, L3_ERROR_GRACE_SECONDS="3")
    failures = []
    codes = {}
    refusals = {}
    started = time.monotonic()
    try:
        box = Sandbox(root, binary, a.mpiexec)
        box.prepare()
        before = box.snapshot()
        for n in range(a.runs):
            run_dir = os.path.join(box.out, "run-%04d" % n)
            prepare_run_dir(box, run_dir)
            args = Generator(rng, box, run_dir).command()
            ranks = 2 if rng.random() < 0.1 else 1
            command = ([a.mpiexec, "-n", "2", binary] if ranks == 2 else [binary]) + args
            stdin = "{\"text\": \"hi\"}\n" if args[0] == "tokenize" else ""
            run_env = env
            if rng.random() < 0.05:  # a job environment whose end time is garbage: warned about
                run_env = dict(env, SLURM_JOB_END_TIME=rng.choice(["garbage", "", "-5", "1e9"]))
            try:
                done = subprocess.run(command, cwd=run_dir, input=stdin, capture_output=True,
                                      text=True, errors="replace", timeout=60, env=run_env)
                code, err = done.returncode, done.stderr
            except subprocess.TimeoutExpired:
                code, err = "time-out", ""
            codes[code] = codes.get(code, 0) + 1
            problems = []
            if code not in DOCUMENTED:
                problems.append("exit code %s" % code)
            if code == 75 and "--deadline" not in args:
                problems.append("exit 75 without a deadline")
            error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
            if error_lines:
                why = " ".join(w for w in error_lines[0].split() if "/" not in w)[:70]
                refusals[why] = refusals.get(why, 0) + 1
            if code == 2 and len(error_lines) != 1:
                problems.append("%d error lines" % len(error_lines))
            after = box.snapshot()
            if after != before:
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                problems.append("changed outside its directories: %s" % changed[:5])
                before = after
            if os.listdir(box.out) != ["run-%04d" % n]:
                problems.append("wrote next to its directory: %s" % sorted(os.listdir(box.out)))
            if problems:
                failures.append(n)
                print("FAIL run %d: %s\n  cd %s && %s\n  stderr: %s" % (
                    n, "; ".join(problems), run_dir, " ".join(repr(x) for x in command),
                    err.strip()[-1500:]), flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if a.keep:
            print("kept", root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("exit codes: %s; %.0f s" % (", ".join("%s: %d" % (k, v) for k, v in sorted(
        codes.items(), key=lambda kv: str(kv[0]))), time.monotonic() - started))
    if a.report:
        for why, count in sorted(refusals.items(), key=lambda kv: -kv[1])[:25]:
            print("%4d  %s" % (count, why))
    if failures:
        print("%d of %d runs failed (seed %d)" % (len(failures), a.runs, a.seed))
        return 1
    print("all %d runs ended with documented exit codes and wrote only where they were told" % a.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
