#!/usr/bin/env bash
# A rehearsal of the one-shot GPU check (tools/gpu-check.sh) on the CPU emulation of the CUDA
# backend, so that the script a GPU session gets one chance to run has run end to end before:
# every stage starts, finds its executable, writes what the summary reads, and the summary
# assembles a complete gpu-<date>-<gpu>.json (tests counted from the JUnit report and the
# training log, the suites' progress logs, op rows including cuDNN's attention, the training rows
# of both attentions, the parity stage's llama3-hpc side, the LoRA and generation benchmarks on the
# CUDA backend); and a suite stopped after 10 s is
# counted (from its progress log where no JUnit report was written), the test it was in named.
# Toy sizes (L3_GPU_CHECK_REHEARSAL=1): the figures mean nothing, the plumbing does.
#   gpu_check_rehearsal.sh LLAMA3_HPC L3_GPU_TESTS L3_BENCH_GPU L3_BENCH_TRAIN_THROUGHPUT [MPIEXEC
#                          [L3_GPU_ZERO2_TEST [L3_BENCH_LORA [L3_BENCH_GENERATE [L3_BENCH_GRPO]]]]]
set -uo pipefail
if (($# < 4)); then
  echo "usage: gpu_check_rehearsal.sh LLAMA3_HPC L3_GPU_TESTS L3_BENCH_GPU L3_BENCH_TRAIN_THROUGHPUT [MPIEXEC [L3_GPU_ZERO2_TEST [L3_BENCH_LORA [L3_BENCH_GENERATE [L3_BENCH_GRPO]]]]]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v python3 >/dev/null; then
  echo "SKIP: the GPU check's summary needs python3"
  exit 77
fi
if ! "$1" --version | grep -q "CUDA emulation"; then
  echo "SKIP: $1 is not a build on the CUDA emulation (L3_CUDA=EMULATED)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-gpu-check-rehearsal.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The executables under the names the check calls, as the GPU bundle puts them on PATH.
mkdir -p "$work/bin"
ln -s "$(realpath "$1")" "$work/bin/llama3-hpc"
ln -s "$(realpath "$2")" "$work/bin/l3_gpu_tests"
ln -s "$(realpath "$3")" "$work/bin/l3-bench-gpu"
ln -s "$(realpath "$4")" "$work/bin/l3-bench-train-throughput"
if [[ -n ${5:-} ]]; then ln -s "$(realpath "$5")" "$work/bin/mpiexec"; fi
if [[ -n ${6:-} ]]; then ln -s "$(realpath "$6")" "$work/bin/l3_gpu_zero2_test"; fi
if [[ -n ${7:-} ]]; then ln -s "$(realpath "$7")" "$work/bin/l3-bench-lora"; fi
if [[ -n ${8:-} ]]; then ln -s "$(realpath "$8")" "$work/bin/l3-bench-generate"; fi
if [[ -n ${9:-} ]]; then ln -s "$(realpath "$9")" "$work/bin/l3-bench-grpo"; fi
lora_given=${7:+1}
generate_given=${8:+1}
grpo_given=${9:+1}

PATH="$work/bin:$PATH" L3_GPU_CHECK_REHEARSAL=1 bash "$root/tools/gpu-check.sh" "$work/out" \
  >"$work/check.log" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "FAIL [tools/gpu-check.sh exited $rc]"
  tail -20 "$work/check.log"
  exit 1
fi
python3 - "$work/out" "${lora_given:-0}" "${generate_given:-0}" "${grpo_given:-0}" <<'PY' || { sed 's/^/  | /' "$work/check.log" | tail -40; exit 1; }
import glob, json, math, os, sys
out = sys.argv[1]
lora_given = sys.argv[2] == "1"
generate_given = sys.argv[3] == "1"
grpo_given = sys.argv[4] == "1"
failed = False
def check(ok, what, detail=""):
    global failed
    print(("ok   [" if ok else "FAIL [") + what + "]" + (f"\n  {detail}" if detail and not ok else ""))
    failed |= not ok

files = glob.glob(os.path.join(out, "gpu-*.json"))
check(len(files) == 1, "one results file gpu-<date>-<gpu>.json", str(files))
if not files:
    sys.exit(1)
doc = json.load(open(files[0]))
name = os.path.basename(files[0])
check(name == f"gpu-{doc.get('date')}-llama3-hpc-cuda-emulation-cpu.json",
      "the file is named after the date and the device", name)
for key in ("impl", "gpu", "commit", "date", "tests", "ops", "gemm_tflops", "copy_gbps", "training"):
    check(key in doc, f"the results have {key}")
check(doc.get("rehearsal") is True, "the results say they are a rehearsal")
check(doc.get("skipped_stages") == [], "no stage was skipped", str(doc.get("skipped_stages")))
tests = doc.get("tests", {})
check(tests.get("failed") == 0 and tests.get("exit_code") == 0 and tests.get("training_exit_code") == 0,
      "the GPU tests and the training checks passed",
      json.dumps({k: tests.get(k) for k in ("failed", "exit_code", "training_exit_code", "failures")}))
check(tests.get("zero2_exit_code") == 0 and "zero2_error" not in tests,
      "the ZeRO-2 accumulation test ran and passed, its report read",
      json.dumps({k: tests.get(k) for k in ("zero2_exit_code", "zero2_error")}))
# 16 test cases on the emulation, and the training checks' "ok" lines.
check(tests.get("passed", 0) >= 20, "the tests were counted from the JUnit report and the training log",
      f"passed {tests.get('passed')}")
ended = [l for l in open(os.path.join(out, "tests-progress.log")) if l.startswith("end\t")]
check(len(ended) >= 16 and len(tests.get("slowest", [])) >= 5 and "unfinished" not in tests,
      "the GPU suite logged its progress: every test ended, the slowest listed",
      f"{len(ended)} ended; " + json.dumps({k: tests.get(k) for k in ("slowest", "unfinished")}))
check(doc.get("gemm_tflops", 0) > 0 and doc.get("copy_gbps", 0) > 0, "the GEMM and copy baselines were measured")
check(doc.get("ops_complete") is True and "cudnn_error" not in doc, "the op benchmark ran every shape")
ops = doc.get("ops", [])
names = {o["op"] for o in ops}
expected = {"embedding", "embedding_backward distinct", "embedding_backward repeated", "matmul q_proj",
            "matmul up_proj", "matmul down_proj", "matmul_backward up", "rmsnorm", "rmsnorm_backward",
            "swiglu", "swiglu_backward", "adamw (up_proj)", "rope (q)",
            "attention (fallback)", "attention_backward (fallback)", "attention (cuDNN)",
            "attention_backward (cuDNN)", "lm_head + CE fwd+bwd"}
check(expected <= names, "every op was timed", f"missing {sorted(expected - names)}")
check(all(o.get("ms", 0) > 0 and ("tflops" in o or "gbps" in o) for o in ops),
      "every op row has a time and a rate")
cudnn = [o for o in ops if "cuDNN" in o["op"]]
check(bool(cudnn) and all(math.isfinite(o.get("rel_err", math.inf)) and "reference" in o for o in cudnn),
      "cuDNN's attention rows carry their error against the fallback")
# No cuDNN engines on the emulation: the rows must say the fallback ran.
check(all("declined" in o for o in cudnn), "the cuDNN rows say where cuDNN declined")
training = doc.get("training", [])
rows = [(t.get("phase"), t.get("attention")) for t in training if t.get("tokens_per_s", 0) > 0]
check(sorted(rows) == [("reward", "default"), ("sft", "cudnn-nondeterministic"), ("sft", "default"),
                      ("sft", "fallback")],
      "training rows: SFT and reward with the default options, SFT with the fallback and cuDNN's "
      "non-deterministic backward", json.dumps(training)[:600])
check(all(t.get("default_options") == (t.get("attention") == "default") for t in training),
      "the default options' rows, and only they, say so", json.dumps(training)[:600])
check(all(t.get("micro_batch") == 1 and t.get("model") == "tiny" for t in training),
      "the rehearsal's training ran the tiny model at one row")
# Which attention ran is counted: on the emulation cuDNN declines, so the cuDNN row's calls all
# went to the fallback, and the row says why.
cudnn_rows = [t for t in training if t.get("attention") == "cudnn-nondeterministic"]
check(bool(cudnn_rows) and all(t.get("cudnn_calls") == 0 and t.get("fallback_calls", 0) > 0
                               and t.get("cudnn_declined") for t in cudnn_rows),
      "the cuDNN training row counts the calls cuDNN and the fallback ran, and cuDNN's refusal",
      json.dumps(cudnn_rows)[:600])
# The parity stage's llama3-hpc side (transformers' side needs the GPU node's python3).
parity = doc.get("hf_parity", {})
prows = parity.get("rows", [])
check(len(prows) == 2 and all(len(r.get("prompt_logprobs", [])) == len(r.get("prompt_ids", [])) - 1 > 8
                              and len(r.get("new_ids", [])) == len(r.get("logprobs", []))
                              and r.get("score_ids") and isinstance(r.get("reward"), float)
                              for r in prows),
      "the parity stage trained, exported, generated with log-probabilities and scored both models",
      json.dumps(prows)[:800])
check(tests.get("parity_exit_code") == 77 and "skipped" in parity,
      "and says that transformers' side did not run here", json.dumps(parity)[:300])
if lora_given:
    lora = doc.get("lora", {})
    models = lora.get("models", [])
    check(doc.get("lora_exit_code") == 0 and lora.get("backend") == "cuda" and len(models) == 1
          and models[0].get("full", {}).get("bytes", 0) > 0
          and all(v.get("time_ratio", 0) > 0 and 0 < v.get("memory_ratio", 0) < 1
                  for v in models[0].get("lora", {}).values()),
          "the LoRA benchmark ran on the CUDA backend: time and memory against full fine-tuning",
          json.dumps(lora)[:600])
variants = doc.get("attention_variants", {})
check(variants.get("exit_code") == 0 and "attention_variants_error" not in doc,
      "the attention variants' stage ran (cuDNN's deterministic and non-deterministic backward)",
      json.dumps({k: doc.get(k) for k in ("attention_variants", "attention_variants_error")})[:800])
if grpo_given:
    runs = doc.get("grpo_async", {}).get("runs") or []
    check(doc.get("grpo_async", {}).get("exit_code") == 0 and "grpo_async_error" not in doc
          and [r.get("generation_ranks") for r in runs if r.get("importance_sampling_correction")]
          == [0, 1]
          and all(r.get("step_ms", 0) > 0 for r in runs),
          "the asynchronous GRPO stage ran on two ranks sharing the device (synchronous, 1 + 1)",
          json.dumps({k: doc.get(k) for k in ("grpo_async", "grpo_async_error")})[:800])
# The 1B-shaped stages (the rehearsal's toy model; the mid model's stages are not rehearsed: the
# same code at the same toy shape).
if generate_given:
    gen = doc.get("generate_1b", {})
    rows = {(r.get("batch"), r.get("decode_path")): r for r in gen.get("decode") or []}
    check(gen.get("exit_code") == 0 and "generate_1b_error" not in doc and gen.get("backend") == "cuda"
          and sorted(rows) == [(1, "graphs"), (1, "per_pass"), (64, "graphs"), (64, "per_pass")]
          and all(r.get("tokens_per_s", 0) > 0 and r.get("ms_per_step", 0) > 0 for r in rows.values())
          and all(rows[(1, p)].get("ratio_to_weight_read", 0) > 0 for p in ("graphs", "per_pass"))
          and all(rows[(64, p)].get("ratio_to_training_forward", 0) > 0 for p in ("graphs", "per_pass"))
          and gen.get("batch1_ratio_to_weight_read", 0) > 0,
          "the 1B-shaped generation benchmark ran on the CUDA backend (its rehearsal's toy model): "
          "decode at batch 1 and 64 by CUDA graphs and per pass, with their ratios",
          json.dumps({k: doc.get(k) for k in ("generate_1b", "generate_1b_error")})[:800])
if grpo_given:
    grpo = doc.get("grpo_1b", {})
    runs = {r.get("mode"): r for r in grpo.get("runs") or []}
    check(grpo.get("exit_code") == 0 and "grpo_1b_error" not in doc and grpo.get("backend") == "cuda"
          and sorted(runs) == ["full", "full_padded", "lora_r16"]
          and all(r.get("step_ms", 0) > 0 and r.get("tokens_per_s", 0) > 0
                  and 0 < r.get("generate_share", 0) < 1 and r.get("train_ms", 0) > 0
                  for r in runs.values())
          and runs["full"].get("train_tokens", 0) < runs["full_padded"].get("train_tokens", 0),
          "the GRPO benchmark ran on the CUDA backend: a step's tokens/s and its split, full and "
          "LoRA; packed completions train fewer positions than padded ones",
          json.dumps({k: doc.get(k) for k in ("grpo_1b", "grpo_1b_error")})[:800])
sys.exit(1 if failed else 0)
PY
# A GPU suite stopped by its time limit, as the check stops it (timeout --foreground: one signal,
# to the suite alone): on SIGTERM (timeout's signal) Catch2 reports the running
# test as failed and ends its JUnit report, which reaches the file or not depending on what its
# stream had buffered when the signal is raised again (both seen here); on SIGKILL there is none.
# Without a report the summary counts the tests from the progress log; either way the running
# test is named as unfinished.
for signal in TERM KILL; do
  killed=$work/killed-$signal
  mkdir -p "$killed"
  L3_EMULATION_DEVICES=2 L3_TEST_PROGRESS_FILE="$killed/tests-progress.log" timeout --foreground -s "$signal" 10 \
    "$2" --reporter junit --out "$killed/tests.xml" >/dev/null 2>&1
  killed_rc=$?
  python3 "$root/tools/gpu_check_summary.py" "$killed" -1 "$killed_rc" -1 -1 -1 10 1 -1 -1 "" \
    >"$killed/summary.log" 2>&1
  python3 - "$killed" "$killed_rc" "$signal" <<'PY' || { cat "$killed/summary.log"; exit 1; }
import glob, json, sys
out, rc, signal = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [l.rstrip("\n").split("\t") for l in open(f"{out}/tests-progress.log")]
started = [f[1] for f in lines if f[0] == "start"]
ended = [f[1] for f in lines if f[0] == "end"]
files = glob.glob(f"{out}/gpu-*.json")
tests = json.load(open(files[0]))["tests"] if files else {}
from_log = "counted from tests-progress.log" in tests.get("error", "")
passed = sum(1 for f in lines if f[0] == "end" and f[2] == "passed")
# On SIGTERM Catch2 ends the running test (failed, the signal its failure); on SIGKILL it never ends.
ok = (rc == (124 if signal == "TERM" else 137) and len(started) - len(ended) == (0 if signal == "TERM" else 1)
      and tests.get("unfinished") == [started[-1]]
      # (JUnit has a test case per section: at least as many)
      and (tests.get("passed") == passed if from_log else tests.get("passed", 0) >= passed)
      and tests.get("failed") == 1 and (from_log or signal == "TERM")
      and any(f["test"].startswith(started[-1]) for f in tests.get("failures", [])))
how = "counted from its progress log" if from_log else "its JUnit report read"
print(("ok   [" if ok else "FAIL [") + f"a GPU suite stopped by SIG{signal} after 10 s: {how} ({len(ended)} "
      f"tests ended), the running test named: {started[-1] if started else None}]")
if not ok:
    print("  exit", rc, json.dumps(tests)[:800])
sys.exit(0 if ok else 1)
PY
done
# The memcheck stage (no compute-sanitizer here) names a cuDNN test the emulated build lacks:
# the name, its commas unescaped, must be one of tests/gpu/cudnn_attention_test.cpp's.
memcheck_test=$(grep -A1 -- "--tool memcheck" "$root/tools/gpu-check.sh" | grep -o "'[^']*'" |
  head -1 | tr -d "'" | sed 's/\\,/,/g')
if [[ -n $memcheck_test ]] &&
  grep -qF "TEST_CASE(\"$memcheck_test\"" "$root/tests/gpu/cudnn_attention_test.cpp"; then
  echo "ok   [the memcheck stage names a test of cudnn_attention_test.cpp: $memcheck_test]"
else
  echo "FAIL [the memcheck stage names a test of cudnn_attention_test.cpp: '${memcheck_test}' is not one]"
  exit 1
fi
# Where the time went (each stage's start), for CI's budget.
grep '^== ' "$work/check.log" | sed 's/^/  | /'
echo "the GPU check ran end to end on the emulation"
