#!/usr/bin/env bash
# `llama3-hpc report`: two synthetic runs (a directory with SFT and reward files, run records, a
# restart, checkpoints and a skipped step; a file of an older version without run records)
# overlaid into one page whose structure is checked; bad inputs and outputs are exit 2 with one
# error line naming the file, leaving no temporary file and an existing report untouched.
#   report_test.sh PATH/TO/llama3-hpc PATH/TO/mpiexec
set -uo pipefail
bin=${1:?usage: report_test.sh LLAMA3_HPC MPIEXEC}
mpiexec=${2:?usage: report_test.sh LLAMA3_HPC MPIEXEC}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")  # the test runs in its own directory
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export L3_ERROR_GRACE_SECONDS=${L3_ERROR_GRACE_SECONDS:-3}
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"

# The two runs (tests/support/report_runs.py): runs/a/ (SFT with a restart after step 40 and
# checkpoints at 20, 40 and 60; reward) and runs/b/metrics.jsonl (SFT, no run records). In a
# directory of their own: cli_checks.sh keeps its files in $work.
mkdir -p "$work/t"
python3 "$(dirname "$0")/../support/report_runs.py" "$work/t/runs"

# Checks the page's structure: python3 prints "ok" or what is wrong.
check_page() {
  python3 - "$1" <<'EOF'
import sys
from html.parser import HTMLParser

class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections, self.charts, self.section = [], {}, None
        self.restarts = self.checkpoints = self.scripts = 0
        self.title, self.in_title, self.text = "", False, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("data-phase")
            self.sections.append(self.section)
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            if a.get("data-phase") != self.section:
                problems.append("chart %s outside its section" % a.get("data-phase"))
            self.charts[a.get("data-phase")] = self.charts.get(a.get("data-phase"), 0) + 1
        if a.get("class") == "restart":
            self.restarts += 1
        if a.get("class") == "checkpoint":
            self.checkpoints += 1
        if tag == "script":
            self.scripts += 1
        self.in_title = tag == "title" and not self.sections
    def handle_endtag(self, tag):
        self.in_title = False
    def handle_data(self, data):
        if self.in_title:
            self.title += data
        self.text.append(data)

problems = []
page = Page()
page.feed(open(sys.argv[1], encoding="utf-8").read())
text = "".join(page.text)
expect = [
    (page.title == "llama3-hpc report", "title %r" % page.title),
    (page.sections == ["sft", "reward"], "sections %s" % page.sections),
    (page.charts == {"sft": 5, "reward": 7}, "charts %s" % page.charts),
    (page.restarts == 5, "%d restart lines, expected one per SFT chart" % page.restarts),
    (page.checkpoints == 3, "%d checkpoint marks, expected 3" % page.checkpoints),
    (page.scripts == 0, "scripts in the page"),
    ("loss 0.5, perplexity 1.649 (step 60)" in text, "run a's final SFT evaluation"),
    ("loss 0.4, perplexity 1.492 (step 50)" in text, "run b's final SFT evaluation"),
    ("accuracy 0.9, margin 3.1 (step 30)" in text, "run a's final reward evaluation"),
    ("60 / 60" in text and "50 / 50" in text, "steps done / total"),
]
problems += [why for good, why in expect if not good]
# Both runs are named in the legends (the paths' common parts left out).
for label in ("a", "b/metrics.jsonl"):
    if ">%s<" % label not in open(sys.argv[1], encoding="utf-8").read():
        problems.append("no legend entry for run %s" % label)
print("ok" if not problems else "; ".join(problems))
EOF
}

cd "$work/t" || exit 1
run "help" 0 "$bin" report --help
expect "help shows --output" contains "$out" "--output"
run "two runs overlaid" 0 "$bin" report runs/a runs/b/metrics.jsonl --output report.html
expect "says what it wrote" contains "$out" "wrote report.html: 2 runs, 12 charts (sft, reward)"
structure=$(check_page report.html)
expect "the page's structure: $structure" [ "$structure" = ok ]
expect "nothing else written" [ "$(ls)" = "$(printf 'report.html\nruns')" ]
run "again, replacing it" 0 "$bin" report runs/a runs/b/metrics.jsonl --output report.html
run "under mpiexec: rank 0 writes it" 0 "$mpiexec" -n 2 "$bin" report runs/a --output mpi.html
expect "one line" [ "$(lines "$out")" = 1 ]
expect "written" [ -s mpi.html ]

# --- bad input and output: exit 2, one error line naming the file, nothing left behind ---
before=$(cksum <report.html)
metrics_before=$(cksum <runs/b/metrics.jsonl)
printf 'my notes\n{"kind":"note","step":1}\n' >notes.jsonl
mkdir -p empty && printf 'x\n' >empty/readme.txt
bad_run() {  # NAME EXPECTED-TEXT ARGS...
  local name=$1 expected=$2
  shift 2
  run "$name" 2 "$bin" report "$@"
  expect "$name: one error line" [ "$(error_lines "$err")" = 1 ]
  expect "$name: says why" contains "$err" "$expected"
  expect "$name: the report untouched" [ "$(cksum <report.html)" = "$before" ]
  expect "$name: no temporary file" [ -z "$(find . -name '*.tmp-*')" ]
}
bad_run "a file with no record" "error: notes.jsonl: holds no metrics record" \
  runs/a notes.jsonl --output report.html
run "under mpiexec, a file with no record" 2 "$mpiexec" -n 2 "$bin" report notes.jsonl \
  --output report.html
expect "one error line" [ "$(error_lines "$err")" = 1 ]
expect "names the file" contains "$err" "notes.jsonl: holds no metrics record"
bad_run "a directory with no metrics file" "error: empty: holds no metrics file" \
  empty --output report.html
bad_run "a missing run" "error: missing.jsonl: no such file or directory" \
  missing.jsonl --output report.html
bad_run "no run" "give at least one RUN" --output report.html
bad_run "no --output" "--output FILE.html is required" runs/a
bad_run "--output a directory" "error: runs: is a directory" runs/a --output runs
ln -s report.html link.html
bad_run "--output a link" "error: link.html: is a symbolic link" runs/a --output link.html
bad_run "--output the metrics file" "is a metrics file the report reads" \
  runs/b/metrics.jsonl --output runs/b/metrics.jsonl
bad_run "--output in a missing directory" "does not exist" runs/a --output nowhere/r.html
expect "the metrics file untouched" [ "$(cksum <runs/b/metrics.jsonl)" = "$metrics_before" ]

# --- what the trainer records, from real runs of the tiny model (vocab 512, hidden 64, its
# lm_head not tied), a step each. A reward model counts its score head (64 values), not the
# lm_head (512 x 64) it does not have. GRPO without --beta and with one iteration per generation
# batch: no chart of the KL (never recorded) or of the clip ratio (the ratio is 1), one line
# saying so; the sampled training reward and the greedy evaluation's on charts of their own. ---
mkdir -p "$work/real" && cd "$work/real" || exit 1
for i in 1 2 3 4 5 6 7 8; do
  printf '{"prompt":"Reverse w%s.","completion":"%sw"}\n' "$i" "$i" >>sft.jsonl
  printf '{"prompt":"Reverse w%s.","chosen":"%sw","rejected":"w%s"}\n' "$i" "$i" "$i" >>pairs.jsonl
  printf '{"prompt":"Reverse w%s.","answer":"%sw"}\n' "$i" "$i" >>prompts.jsonl
done
run "prep sft" 0 "$bin" prep sft --input sft.jsonl --tokenizer bytes --output sft
run "prep preference" 0 "$bin" prep preference --input pairs.jsonl --tokenizer bytes --output pairs
run "prep prompts" 0 "$bin" prep prompts --input prompts.jsonl --tokenizer bytes --output prompts \
  --val-fraction 0.25
step=(--seq-len 128 --global-batch 2 --lr 1e-3 --steps 1 --log-every 0 --no-progress)
run "an SFT step" 0 "$bin" sft --model tiny --data sft "${step[@]}" --ckpt-dir ck \
  --metrics metrics-sft.jsonl
run "a reward step" 0 "$bin" reward --model tiny --data pairs "${step[@]}" \
  --metrics metrics-reward.jsonl
run "a GRPO step" 0 "$bin" grpo --init ck --data prompts/train --val-data prompts/val \
  --eval-every 1 --reward-match answer --num-generations 2 --micro-batch 2 \
  --max-completion-length 4 "${step[@]}" --metrics metrics-grpo.jsonl
parameters() {
  python3 -c 'import json, sys
print(next(r["parameters"] for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "run"))' "$1"
}
sft_parameters=$(parameters metrics-sft.jsonl)
reward_parameters=$(parameters metrics-reward.jsonl)
expect "a reward model's parameters: the SFT model's less the lm_head plus the score head ($sft_parameters, $reward_parameters)" \
  [ "$reward_parameters" = $((sft_parameters - 512 * 64 + 64)) ]
# The same GRPO run as if it had --beta and two iterations: its KL and clip ratio are drawn.
python3 - <<'PY'
import json
with open("metrics-grpo.jsonl") as f, open("beta.jsonl", "w") as out:
    for r in map(json.loads, f):
        if r["kind"] == "run":
            r["grpo"].update(beta=0.04, num_iterations=2)
        if r["kind"] == "train":
            r["kl"] = 0.01
        out.write(json.dumps(r) + "\n")
PY
run "the report of the real runs" 0 "$bin" report . --output real.html
run "with a run that has --beta" 0 "$bin" report . beta.jsonl --output beta.html
checks=$(python3 - <<'PY'
import re
problems = []
def grpo(page):
    html = open(page, encoding="utf-8").read()
    section = html[html.index('<section data-phase="grpo"'):]
    charts = dict(re.findall(r'<svg class="chart" data-phase="grpo" data-metric="([^"]*)"(.*?)</svg>',
                             section, re.S))
    line = re.findall(r'<p class="not-drawn" data-phase="grpo">(.*?)</p>', section)
    return html, charts, line
html, charts, line = grpo("real.html")
if "kl" in charts or "clip_ratio/region_mean" in charts:
    problems.append("an empty chart drawn: %s" % sorted(charts))
want = ("Not drawn: KL to the reference (no --beta), clip ratio (--num-iterations 1: the ratio is 1), "
        "waiting (no --generation-ranks), turns (no --environment).")
if line != [want]:
    problems.append("the not-drawn line %s" % line)
train, greedy = charts.get("reward", ""), charts.get("eval_reward", "")
if "training reward<" not in train or "evaluation reward<" in train:
    problems.append("the training reward's chart")
if "evaluation reward<" not in greedy or "training reward<" in greedy:
    problems.append("the greedy evaluation's chart")
if html.count('class="not-drawn"') != 1:
    problems.append("a not-drawn line outside GRPO's section")
html, charts, line = grpo("beta.html")
if "kl" not in charts or "clip_ratio/region_mean" not in charts or line != [
        "Not drawn: waiting (no --generation-ranks), turns (no --environment)."]:
    problems.append("with --beta: charts %s, line %s" % (sorted(charts), line))
print("; ".join(problems) or "ok")
PY
)
expect "GRPO's charts: $checks" [ "$checks" = ok ]

finish_cli_checks "report checks"
