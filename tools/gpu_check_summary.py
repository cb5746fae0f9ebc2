#!/usr/bin/env python3
"""The one-shot GPU check's summary (tools/gpu-check.sh runs it last): assembles
gpu-<date>-<gpu>.json in OUTDIR from what the stages left there (JUnit reports or progress logs of
the test binaries, the training checks' log, the op benchmark's and throughput benchmarks' JSON,
the transformers baseline and parity rows). Schema in docs/GPU.md.

  gpu_check_summary.py OUTDIR SMOKE_RC TESTS_RC TRAINING_RC BENCH_RC MEMCHECK_RC SECONDS REHEARSAL
                       PARITY_RC ZERO2_RC [SKIPPED_STAGES;...]
(an exit code of -1: the stage did not run). The LoRA, generation, GRPO and attention-variant
benchmarks' exit codes come in the environment (L3_GPU_CHECK_LORA_RC, L3_GPU_CHECK_GENERATE_RC,
L3_GPU_CHECK_GENERATE_1B_RC, L3_GPU_CHECK_GRPO_RC, L3_GPU_CHECK_GRPO_1B_RC, L3_GPU_CHECK_GRPO_ASYNC_RC,
L3_GPU_CHECK_ATTENTION_RC), their rows from OUTDIR/lora.json, generate.json, generate-1b.json,
grpo.json, grpo-1b.json and attention-variants.json.
"""
import json, sys, os, re, glob, datetime, xml.etree.ElementTree as ET
out, smoke, tests_rc, training_rc, bench_rc, memcheck_rc, seconds, rehearsal, parity_rc, zero2_rc = \
    sys.argv[1], *map(int, sys.argv[2:11])
skipped = [s for s in sys.argv[11].split(";") if s] if len(sys.argv) > 11 else []
tests = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}


def read_progress(path):
    """The test binary's progress log (tests/support/progress_listener.hpp): per test, its outcome,
    seconds and failed assertions; the test that was stopped (it started and never ended, or
    Catch2 ended it after a fatal signal such as timeout's SIGTERM), if any; and, for a test that
    never ended, its failures so far."""
    cases, running, failures, stopped = [], None, [], None
    for line in open(path, errors="replace"):
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "start" and len(fields) >= 2:
            running, failures = fields[1], []
        elif fields[0] == "fail" and len(fields) >= 3:
            failures.append(f"{fields[1]}: {fields[2]}")
        elif fields[0] == "end" and len(fields) >= 4:
            cases.append({"name": fields[1], "passed": fields[2] == "passed",
                          "seconds": float(fields[3]), "failures": failures})
            if any(re.search(r"\bSIG[A-Z]+ - ", f) for f in failures):
                stopped = fields[1]
            running, failures = None, []
    return cases, running or stopped, running is not None, failures


# JUnit reports: l3_gpu_tests' (required) and the ZeRO-2 test's (where it ran). Catch2 writes its
# report when the binary ends; on SIGTERM (timeout's signal) it ends the report with the running
# test failed, but what its file stream had buffered is lost when the signal is raised again, and
# on SIGKILL nothing is written. Without a readable report the tests are counted from the progress
# log; either way the test that was running when it stopped is "unfinished".
for report, progress, rc, key in (("tests.xml", "tests-progress.log", tests_rc, "error"),
                                  ("tests-zero2.xml", "tests-zero2-progress.log", zero2_rc, "zero2_error")):
    if report != "tests.xml" and rc == -1:
        continue
    try:
        cases, stopped, unended, partial = read_progress(os.path.join(out, progress))
    except OSError:
        cases, stopped, unended, partial = [], None, False, []
    # The slowest tests, for the suite's two-minute target.
    slowest = sorted(cases, key=lambda c: -c["seconds"])[:5]
    if slowest:
        tests.setdefault("slowest", []).extend({"test": c["name"], "seconds": c["seconds"]} for c in slowest)
    try:
        root = ET.parse(os.path.join(out, report)).getroot()
        for case in root.iter("testcase"):
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            if node is not None:
                tests["failed"] += 1
                tests["failures"].append({"test": case.get("name"), "message": (node.get("message") or "")[:500],
                                          "detail": (node.text or "")[:2000]})
            elif case.find("skipped") is not None:
                tests["skipped"] += 1
            else:
                tests["passed"] += 1
    except Exception as e:  # no XML: the suite crashed, was killed, skipped as a whole, or did not run
        tests[key] = f"no test report {report} ({e}); exit code {rc}"
        if cases or stopped:
            tests[key] += f"; counted from {progress}"
            for c in cases:
                if c["passed"]:
                    tests["passed"] += 1
                else:
                    tests["failed"] += 1
                    tests["failures"].append({"test": c["name"], "message": "; ".join(c["failures"])[:500]})
        if unended:  # killed (or crashed) inside this test: a failure
            tests["failed"] += 1
            tests["failures"].append({"test": stopped, "message": f"did not finish (exit code {rc})"
                                      + ("; " + "; ".join(partial) if partial else "")})
    if stopped:  # the first place to look for a hang
        tests.setdefault("unfinished", []).append(stopped)
# The training checks count as tests too: "ok   [...]" / "FAIL [...]" lines.
try:
    for line in open(os.path.join(out, "training-tests.log")):
        if line.startswith("ok   ["):
            tests["passed"] += 1
        elif line.startswith("FAIL ["):
            tests["failed"] += 1
            tests["failures"].append({"test": "gpu/training: " + line[6:].strip().rstrip("]"), "message": ""})
except OSError:
    pass
# Parity with transformers: a test per model variant (not where transformers was missing).
parity = None
try:
    parity = json.load(open(os.path.join(out, "parity.json")))
    for row in parity.get("rows", []):
        if "passed" not in row:
            continue
        if row["passed"]:
            tests["passed"] += 1
        else:
            tests["failed"] += 1
            tests["failures"].append({"test": "hf parity: " + row["variant"],
                                      "message": row.get("error", json.dumps(
                                          {k: row.get(k) for k in ("logprob_max_abs_diff", "greedy_agrees",
                                                                   "reward", "reward_hf", "reward_peft")}))})
except (OSError, ValueError):
    pass
tests.update(exit_code=tests_rc, zero2_exit_code=zero2_rc, training_exit_code=training_rc, smoke_exit_code=smoke,
             memcheck_exit_code=memcheck_rc, parity_exit_code=parity_rc)
doc = {"impl": "llama3-hpc", "tests": tests, "bench_exit_code": bench_rc, "seconds": seconds,
       "skipped_stages": skipped}
if rehearsal:
    doc["rehearsal"] = True  # toy sizes: never a result to commit
if parity is not None:
    doc["hf_parity"] = parity
doc["lora_exit_code"] = int(os.environ.get("L3_GPU_CHECK_LORA_RC", "-1"))
try:
    lora = json.load(open(os.path.join(out, "lora.json")))
    doc["lora"] = {"backend": lora.get("backend"), "models": lora.get("models", [])}
except OSError:
    pass
except ValueError as e:
    doc["lora_error"] = str(e)
# Generation (decode rows: batch 1 against the weights' read time, the others against the
# training forward; prefill), GRPO (a step's tokens/s and split, full and LoRA, packed and
# padded) and cuDNN attention's variants: each stage's file under its key, its exit code beside
# it; a stage that ran and left no readable file gets KEY_error.
def stage_results(key, file, rc_variable, fields=None):
    rc = int(os.environ.get(rc_variable, "-1"))
    try:
        data = json.load(open(os.path.join(out, file)))
        doc[key] = {k: data.get(k) for k in fields} if fields else data
        doc[key]["exit_code"] = rc
    except OSError:
        if rc != -1:  # the stage ran and wrote no results (failed, or its time limit)
            doc[f"{key}_error"] = f"no {file}; exit code {rc}"
    except ValueError as e:
        doc[f"{key}_error"] = f"{file}: {e}; exit code {rc}"


generate_fields = ("backend", "model", "parameters", "weight_bytes", "weight_read_ms", "weight_read_gb_per_s",
                   "training_forward_tokens_per_s", "decode", "decode_paths",
                   "batch1_ratio_to_weight_read", "batch64_ratio_to_training_forward", "prefill_tokens_per_s")
grpo_fields = ("backend", "model", "prompts_per_step", "num_generations", "max_completion_length", "runs")
stage_results("generate", "generate.json", "L3_GPU_CHECK_GENERATE_RC", generate_fields)
stage_results("generate_1b", "generate-1b.json", "L3_GPU_CHECK_GENERATE_1B_RC", generate_fields)
stage_results("grpo", "grpo.json", "L3_GPU_CHECK_GRPO_RC", grpo_fields)
stage_results("grpo_1b", "grpo-1b.json", "L3_GPU_CHECK_GRPO_1B_RC", grpo_fields)
stage_results("grpo_async", "grpo-async.json", "L3_GPU_CHECK_GRPO_ASYNC_RC",
              ("backend", "model", "ranks", "prompts_per_step", "max_completion_length", "runs"))
stage_results("attention_variants", "attention-variants.json", "L3_GPU_CHECK_ATTENTION_RC")
try:
    doc.update(json.load(open(os.path.join(out, "bench.json"))))
except Exception as e:
    doc["bench_error"] = str(e)
training = []
for path in sorted(glob.glob(os.path.join(out, "train-*.json"))):
    try:
        d = json.load(open(path))
        doc.setdefault("gpu", d.get("gpu"))
        doc.setdefault("commit", d.get("commit"))
        training += d.get("training", [])
    except Exception as e:
        training.append({"impl": "llama3-hpc", "error": f"{os.path.basename(path)}: {e}"})
for path in sorted(glob.glob(os.path.join(out, "hf-*.json"))):
    try:
        row = json.load(open(path))
        ours = [t for t in training if t.get("impl") == "llama3-hpc" and t.get("model") == row.get("model")
                and t.get("phase") == row.get("phase")]
        ours = [t for t in ours if "tokens_per_s" in t]
        if ours and "tokens_per_s" in row:  # the faster of llama3-hpc's attentions
            row["llama3_hpc_speedup"] = max(t["tokens_per_s"] for t in ours) / row["tokens_per_s"]
        default = [t for t in ours if t.get("default_options")]
        if default and "tokens_per_s" in row:  # what a user gets without options (issue 59)
            row["default_options_speedup"] = default[0]["tokens_per_s"] / row["tokens_per_s"]
        training.append(row)
    except Exception as e:
        training.append({"impl": "transformers", "error": f"{os.path.basename(path)}: {e}"})
doc["training"] = training
doc.setdefault("date", datetime.date.today().isoformat())
gpu = re.sub(r"[^A-Za-z0-9]+", "-", doc.get("gpu") or "unknown-gpu").strip("-").lower()
name = f"gpu-{doc['date']}-{gpu}.json"
json.dump(doc, open(os.path.join(out, name), "w"), indent=2)
print(f"wrote {name}: tests passed {tests['passed']}, failed {tests['failed']}, skipped "
      f"{tests['skipped']}; {len(training)} training rows; {seconds} s")
