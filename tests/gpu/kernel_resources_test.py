#!/usr/bin/env python3
"""Every CUDA kernel of the backend fits the launches it gets, on each architecture it is built for.

Runs in CI without a GPU (ctest gpu-offline/kernel_resources). The emulation runs kernels on the
CPU and checks grid, block and shared-memory limits at each launch, but it has no registers: a
kernel that needs more registers than its block can have fails on a real GPU only, at launch
("too many resources requested"), and a kernel that spills registers to local memory runs
slower without any test noticing. So each source is compiled to a cubin here with ptxas's
resource report (device code only, about 2 s a file), and for every kernel of namespace l3::cuda:

- registers: a block of B threads needs ceil(B / 32) warps of 32 * R registers (R rounded up to
  the allocation unit of 8) out of the SM's 65536, so R <= 64 for B = 1024. B is the kernel's
  __launch_bounds__ (PTX .maxntid) where it declares one, else 1024: any launch may use up to
  that (the cross-entropy kernel launches 1024 threads);
- no stack frame and no spill stores or loads;
- static shared memory within the 48 KiB a block gets without an opt-in.

Each source must report at least as many kernels as it declares __global__ functions, so a
change in ptxas's report format fails the test rather than passing it empty.

  kernel_resources_test.py --nvcc NVCC --arch 90 [--arch 80 ...] [-I DIR ...] [-D NAME ...]
                           SOURCE.cu ... [--expect-failures FIXTURE.cu KERNEL ...]

--expect-failures compiles a fixture whose named kernels must each be rejected and whose other
kernels must pass (the check's own test: a check that cannot fail proves nothing, and the
fixture's bounded kernel passes only if .maxntid is read).
"""

import argparse
import concurrent.futures
import math
import os
import re
import subprocess
import sys
import tempfile

REGISTERS_PER_SM = 65536  # sm_80 and sm_90
REGISTER_UNIT = 8  # per-thread allocation granularity (256 per warp)
MAX_THREADS = 1024
STATIC_SHARED_LIMIT = 48 * 1024
NAMESPACE_MANGLING = "N2l34cuda"  # _ZN2l34cuda...: l3::cuda (and its nested namespaces)

ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\w+)'")
PROPERTIES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(.*)")
SMEM = re.compile(r"(\d+) bytes smem")
PTX_ENTRY = re.compile(r"\.entry\s+(\S+)\s*\(")
MAXNTID = re.compile(r"\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)")


def compile_report(args, source, arch, workdir):
    """ptxas's resource report and the PTX (for .maxntid) of one source for one architecture."""
    stem = os.path.join(workdir, f"{os.path.basename(source)}.sm_{arch}")
    os.makedirs(stem, exist_ok=True)
    command = [args.nvcc, "-std=c++20", "-O3", "-DNDEBUG", f"-arch=sm_{arch}",
               "--resource-usage", "-cubin", "--keep", "--keep-dir", stem,
               "-o", os.path.join(stem, "out.cubin")]
    command += [f"-I{d}" for d in args.include] + [f"-D{d}" for d in args.define]
    command += ["-x", "cu", source]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{source}: nvcc failed for sm_{arch}:\n{done.stderr.strip()}")
    ptx = ""
    for name in os.listdir(stem):
        if name.endswith(".ptx"):
            with open(os.path.join(stem, name), encoding="utf-8") as f:
                ptx += f.read()
    return done.stderr + done.stdout, ptx


def launch_bounds(ptx):
    """Kernel name -> threads per block its __launch_bounds__ allows (absent: no bound)."""
    bounds = {}
    for match in PTX_ENTRY.finditer(ptx):
        body_start = ptx.find("{", match.end())
        declared = MAXNTID.search(ptx, match.end(), body_start if body_start >= 0 else len(ptx))
        if declared:
            bounds[match.group(1)] = math.prod(int(d) for d in declared.groups())
    return bounds


def parse_kernels(report):
    """[(name, arch, registers, stack, spill stores, spill loads, static smem)] from ptxas -v."""
    kernels = []
    current = None
    for line in report.splitlines():
        if m := ENTRY.search(line):
            current = {"name": m.group(1), "arch": m.group(2)}
        elif current is not None and (m := PROPERTIES.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
        elif current is not None and (m := USED.search(line)):
            current["registers"] = int(m.group(1))
            smem = SMEM.search(m.group(2))
            current["smem"] = int(smem.group(1)) if smem else 0
            kernels.append(current)
            current = None
    return kernels


def names_kernel(mangled, name):
    """Whether the mangled name is that of the function `name` (its length-prefixed identifier)."""
    return f"{len(name)}{name}E" in mangled


def problems_of(kernel, bound):
    threads = bound if bound is not None else MAX_THREADS
    registers = -(-kernel["registers"] // REGISTER_UNIT) * REGISTER_UNIT
    needed = -(-threads // 32) * 32 * registers
    found = []
    if needed > REGISTERS_PER_SM:
        where = f"its __launch_bounds__ ({threads})" if bound is not None else \
            f"any launch up to {MAX_THREADS} threads (declare __launch_bounds__ to allow fewer)"
        found.append(f"{kernel['registers']} registers: a block of {threads} threads needs "
                     f"{needed} > {REGISTERS_PER_SM}, so {where} cannot start")
    if kernel.get("stack", 0) or kernel.get("spill_stores", 0) or kernel.get("spill_loads", 0):
        found.append(f"{kernel.get('stack', 0)} bytes stack frame, {kernel.get('spill_stores', 0)} "
                     f"bytes spill stores, {kernel.get('spill_loads', 0)} bytes spill loads "
                     "(local memory: slow)")
    if kernel["smem"] > STATIC_SHARED_LIMIT:
        found.append(f"{kernel['smem']} bytes of static shared memory > {STATIC_SHARED_LIMIT}")
    return found


def check(args, source, arch, workdir):
    """(lines to print, problems as (kernel, text)) for one source and architecture."""
    report, ptx = compile_report(args, source, arch, workdir)
    bounds = launch_bounds(ptx)
    kernels = [k for k in parse_kernels(report) if NAMESPACE_MANGLING in k["name"]]
    with open(source, encoding="utf-8") as f:
        declared = len(re.findall(r"__global__", f.read()))
    lines, problems = [], []
    if len(kernels) < declared:
        problems.append((os.path.basename(source),
                         f"ptxas reported {len(kernels)} l3::cuda kernels for sm_{arch}, the file "
                         f"declares {declared} __global__ functions (report format changed?)"))
    for kernel in kernels:
        bound = bounds.get(kernel["name"])
        lines.append(f"  sm_{arch} {kernel['registers']:3d} regs {kernel['smem']:6d} B smem "
                     f"{'bound ' + str(bound) if bound else 'no bound':>10}  "
                     f"{os.path.basename(source)} {kernel['name']}")
        problems += [(kernel["name"], text) for text in problems_of(kernel, bound)]
    return lines, problems


def run_all(args, sources, workdir):
    jobs = [(s, a) for s in sources for a in args.arch]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(check, args, s, a, workdir): (s, a) for s, a in jobs}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
    lines, problems = [], []
    for job in jobs:
        lines += results[job][0]
        problems += [(job[0], job[1], kernel, text) for kernel, text in results[job][1]]
    return lines, problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvcc", required=True)
    parser.add_argument("--arch", action="append", required=True,
                        help="compute capability digits, e.g. 90 (repeatable)")
    parser.add_argument("-I", dest="include", action="append", default=[])
    parser.add_argument("-D", dest="define", action="append", default=[])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("L3_JOBS", "2")))
    parser.add_argument("--expect-failures", nargs="+", metavar=("FIXTURE", "KERNEL"))
    parser.add_argument("sources", nargs="+")
    args = parser.parse_args()
    given = args.arch
    args.arch = [re.sub(r"[^0-9]", "", a) for a in given if re.sub(r"[^0-9]", "", a)]
    if not args.arch:  # e.g. L3_CUDA_ARCHS=native: nothing named to compile for
        print(f"SKIP: no numbered architecture among {given}")
        return 77

    with tempfile.TemporaryDirectory(prefix="l3-kernel-resources-") as workdir:
        try:
            lines, problems = run_all(args, args.sources, workdir)
            fixture_problems = []
            if args.expect_failures:
                fixture, *names = args.expect_failures
                _, fixture_problems = run_all(args, [fixture], workdir)
        except RuntimeError as error:
            print(f"FAIL: {error}")
            return 1

    print("\n".join(lines))
    failed = False
    for source, arch, kernel, text in problems:
        print(f"FAIL: {os.path.basename(source)} sm_{arch}: {kernel}: {text}")
        failed = True
    if args.expect_failures:
        for name in names:
            caught = [t for _, _, k, t in fixture_problems if names_kernel(k, name)]
            if caught:
                print(f"fixture kernel {name} rejected as it should be: {caught[0]}")
            else:
                print(f"FAIL: the fixture's kernel {name} passed the check; it must not")
                failed = True
        for _, arch, kernel, text in fixture_problems:
            if not any(names_kernel(kernel, name) for name in names):
                print(f"FAIL: the fixture's kernel {kernel} (sm_{arch}) should pass: {text}")
                failed = True
    if failed:
        return 1
    print(f"{len(lines)} kernels (sources x architectures) fit their launches, no spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
