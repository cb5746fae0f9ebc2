#!/usr/bin/env bash
# The one-shot GPU check, run on a GPU node with the bundled executables on PATH:
# version report, GPU smoke test, the GPU test suite (every CUDA op and the tiny model against
# the CPU reference), then the op benchmark. Writes under OUTDIR:
#   tests.xml (JUnit), tests.log, bench.log, and gpu-<date>-<gpu>.json, the results file
#   committed to bench/results/ (schema in docs/GPU.md).
#   bash .gpubundle/run.sh bash tools/gpu-check.sh OUTDIR
set -uo pipefail
out=${1:?usage: gpu-check.sh OUTDIR}
mkdir -p "$out"
start=$(date +%s)
llama3-hpc --version | tee "$out/version.txt"
l3_gpu_device_smoke_test | tee "$out/smoke.log"
smoke=${PIPESTATUS[0]}
timeout 600 l3_gpu_tests --reporter junit --out "$out/tests.xml" > "$out/tests.log" 2>&1
tests_rc=$?
timeout 900 l3-bench-gpu --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
bench_rc=${PIPESTATUS[0]}
python3 - "$out" "$smoke" "$tests_rc" "$bench_rc" "$(( $(date +%s) - start ))" <<'PY'
import json, sys, os, re, datetime, xml.etree.ElementTree as ET
out, smoke, tests_rc, bench_rc, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tests = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
try:
    root = ET.parse(os.path.join(out, "tests.xml")).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            tests["failed"] += 1
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            tests["failures"].append({"test": case.get("name"), "message": (node.get("message") or "")[:500],
                                      "detail": (node.text or "")[:2000]})
        elif case.find("skipped") is not None:
            tests["skipped"] += 1
        else:
            tests["passed"] += 1
except Exception as e:  # no XML: the suite crashed or skipped as a whole
    tests["error"] = f"no test report ({e}); exit code {tests_rc}"
tests["exit_code"] = tests_rc
tests["smoke_exit_code"] = smoke
doc = {"impl": "llama3-hpc", "tests": tests, "bench_exit_code": bench_rc, "seconds": seconds}
try:
    doc.update(json.load(open(os.path.join(out, "bench.json"))))
except Exception as e:
    doc["bench_error"] = str(e)
doc.setdefault("date", datetime.date.today().isoformat())
gpu = re.sub(r"[^A-Za-z0-9]+", "-", doc.get("gpu", "unknown-gpu")).strip("-").lower()
name = f"gpu-{doc['date']}-{gpu}.json"
json.dump(doc, open(os.path.join(out, name), "w"), indent=2)
print(f"wrote {name}: tests passed {tests['passed']}, failed {tests['failed']}, skipped {tests['skipped']}")
PY
