#!/usr/bin/env python3
"""The timing table of a .ci/run: its stages' seconds, each ctest run's test count and slowest
tests (from ctest's JUnit file), the total; printed, and written as JSON for comparing runs.

  times.py --stages STAGES.tsv --start EPOCH [--junit NAME=FILE]... [--commit SHA]
           [--exit-code N] [--failed-stage NAME] [--json OUT.json]

STAGES.tsv has a line per finished stage: NAME<TAB>SECONDS. A missing JUnit file (a stage that
did not run) is left out."""
import argparse
import json
import os
import socket
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SLOWEST = 15


def read_stages(path):
    stages = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, _, seconds = line.rstrip("\n").partition("\t")
            if name:
                stages.append({"stage": name, "seconds": round(float(seconds), 1)})
    return stages


def read_junit(path):
    """The tests of one ctest run: count, outcomes, the slowest with their seconds."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        status = case.get("status") or "run"
        if case.find("failure") is not None:
            status = "fail"
        elif case.find("skipped") is not None:
            status = "skipped"
        tests.append({"name": case.get("name"), "seconds": round(float(case.get("time") or 0), 1),
                      "status": status})
    tests.sort(key=lambda t: -t["seconds"])
    outcomes = {}
    for t in tests:
        outcomes[t["status"]] = outcomes.get(t["status"], 0) + 1
    return {"tests": len(tests), "outcomes": outcomes,
            "test_seconds_sum": round(sum(t["seconds"] for t in tests), 1),
            "slowest": tests[:SLOWEST]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--junit", action="append", default=[], metavar="NAME=FILE")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--failed-stage", default="")
    parser.add_argument("--json")
    args = parser.parse_args()

    stages = read_stages(args.stages)
    runs = {}
    for item in args.junit:
        name, _, path = item.partition("=")
        if os.path.isfile(path):
            runs[name] = read_junit(path)
    result = {
        "commit": args.commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "exit_code": args.exit_code,
        "failed_stage": args.failed_stage or None,
        "stages": stages,
        "total_seconds": round(time.time() - args.start, 1),
        "ctest": runs,
    }

    out = sys.stdout
    print("\n.ci/run timing (seconds)", file=out)
    for s in stages:
        print(f"  {s['stage']:<20} {s['seconds']:>8.1f}", file=out)
    if args.failed_stage:
        print(f"  {args.failed_stage:<20} {'failed':>8} (exit {args.exit_code})", file=out)
    print(f"  {'total':<20} {result['total_seconds']:>8.1f}", file=out)
    for name, run in runs.items():
        counts = ", ".join(f"{n} {k}" for k, n in sorted(run["outcomes"].items()))
        print(f"\nctest {name}: {run['tests']} tests ({counts}); the {len(run['slowest'])} slowest:",
              file=out)
        for t in run["slowest"]:
            print(f"  {t['seconds']:>7.1f}  {t['name']}", file=out)

    if args.json:
        directory = os.path.dirname(os.path.abspath(args.json))
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False,
                                         prefix=".ci-times.", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        os.replace(f.name, args.json)
        print(f"\n(written to {args.json})", file=out)


if __name__ == "__main__":
    main()
