#!/usr/bin/env python3
"""Checks spack/packages/llama3-hpc/package.py against the project's CMake build:

  * the file parses, and its class is a CMakePackage and a CudaPackage with version("main");
  * cmake_args() for several specs (~cuda, +cuda cuda_arch=90, +cuda cuda_arch=80,90 +tests) passes
    only options that the project's CMake defines (option() or a CACHE variable), and maps every
    variant: cuda -> L3_CUDA, cuda_arch -> L3_CUDA_ARCHS, tests -> L3_BUILD_TESTS;
  * the package's dependencies equal the list the CMake configure step wrote of what it looked
    for (BUILD_DIR/l3-dependencies.txt: one Spack spec per l3_require, with "when +variant"),
    with the same variants and conditions; the GPU libraries (found only where CUDA is) are taken
    from cmake/L3Cuda.cmake when the build had no CUDA.

Spack itself is not needed (nor installed in CI): the package is executed against a small
recording implementation of the directives it uses (version, variant, depends_on, conflicts,
license) and of CMakePackage.define/define_from_variant, which follow Spack's documented
semantics. Where a real `spack` is on PATH, `spack repo add` + `spack info` are run as well.

  check_package.py SOURCE_DIR BUILD_DIR
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

source_dir, build_dir = sys.argv[1], sys.argv[2]
package_path = os.path.join(source_dir, "spack", "packages", "llama3-hpc", "package.py")
failures = []


def check(name, condition, detail=""):
    print(("ok   " if condition else "FAIL ") + f"[{name}]" + (f": {detail}" if detail and not condition else ""))
    if not condition:
        failures.append(name)


# ---- a recording stand-in for Spack's package API ------------------------------------------
directives = []  # (kind, args, kwargs, owner class name)


def _directive(kind):
    def record(*args, **kwargs):
        frame = sys._getframe(1)
        directives.append((kind, args, kwargs, frame.f_code.co_name))
    return record


class Variant:
    def __init__(self, value):
        self.value = value


class Spec:
    """What cmake_args() reads: variants and satisfies('+name' / '~name' / 'name=value')."""

    def __init__(self, **variants):
        self.variants = {k: Variant(v) for k, v in variants.items()}

    def satisfies(self, constraint):
        for term in constraint.split():
            if term.startswith("+") and self.variants[term[1:]].value is not True:
                return False
            if term.startswith("~") and self.variants[term[1:]].value is not False:
                return False
            if "=" in term:
                name, value = term.split("=", 1)
                current = self.variants[name].value
                if value not in (current if isinstance(current, tuple) else (current,)):
                    return False
        return True


class PackageBase:
    def __init__(self, spec):
        self.spec = spec

    def define(self, name, value):  # Spack: -DNAME:BOOL=ON/OFF, -DNAME:STRING=a;b for lists
        if isinstance(value, bool):
            return f"-D{name}:BOOL={'ON' if value else 'OFF'}"
        if isinstance(value, (list, tuple)):
            return f"-D{name}:STRING={';'.join(str(v) for v in value)}"
        return f"-D{name}:STRING={value}"

    def define_from_variant(self, name, variant):
        return self.define(name, self.spec.variants[variant].value)


package_api = types.ModuleType("spack.package")
for kind in ("version", "variant", "depends_on", "conflicts", "requires", "license", "maintainers",
             "provides", "patch", "resource"):
    setattr(package_api, kind, _directive(kind))
exec(compile('''
class CMakePackage(PackageBase):
    variant("build_type", default="Release", description="CMake build type")

class CudaPackage(PackageBase):
    variant("cuda", default=False, description="Build with CUDA")
    variant("cuda_arch", values=("none", "80", "90"), default="none", multi=True, when="+cuda")
''', "<spack build systems>", "exec"), {**vars(package_api), "PackageBase": PackageBase}, ns := {})
package_api.CMakePackage = ns["CMakePackage"]
package_api.CudaPackage = ns["CudaPackage"]
package_api.__all__ = [n for n in vars(package_api) if not n.startswith("_")]
spack_module = types.ModuleType("spack")
spack_module.package = package_api
sys.modules["spack"] = spack_module
sys.modules["spack.package"] = package_api
base_directives = len(directives)

# ---- the package file ------------------------------------------------------------------------
source = open(package_path, encoding="utf-8").read()
try:
    tree = ast.parse(source, package_path)
    check("package.py parses", True)
except SyntaxError as e:
    check("package.py parses", False, str(e))
    sys.exit(1)
classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
check("one package class, Llama3Hpc", [c.name for c in classes] == ["Llama3Hpc"], str([c.name for c in classes]))
bases = [b.id for b in classes[0].bases if isinstance(b, ast.Name)] if classes else []
check("it is a CMakePackage and a CudaPackage", bases == ["CMakePackage", "CudaPackage"], str(bases))

namespace = {"__name__": "llama3_hpc_package"}
exec(compile(source, package_path, "exec"), namespace)
Package = namespace["Llama3Hpc"]
own = [d for d in directives[base_directives:] if d[3] == "Llama3Hpc"]
versions = [(d[1], d[2]) for d in own if d[0] == "version"]
check('version("main", branch="main")', (("main",), {"branch": "main"}) in versions, str(versions))
check("a git URL for version main", bool(getattr(Package, "git", "")))
variants = {d[1][0] for d in directives if d[0] == "variant"}
check("variants cuda, cuda_arch, tests", {"cuda", "cuda_arch", "tests"} <= variants, str(sorted(variants)))
conflicts = [(d[1], d[2].get("when")) for d in own if d[0] == "conflicts"]
check("cuda_arch=none conflicts with +cuda", (("cuda_arch=none",), "+cuda") in conflicts, str(conflicts))

# ---- cmake_args against the project's CMake options ------------------------------------------
cmake_text = open(os.path.join(source_dir, "CMakeLists.txt"), encoding="utf-8").read()
for name in sorted(os.listdir(os.path.join(source_dir, "cmake"))):
    if name.endswith(".cmake"):
        cmake_text += open(os.path.join(source_dir, "cmake", name), encoding="utf-8").read()
cmake_options = set(re.findall(r"\boption\(\s*(\w+)", cmake_text))
cmake_options |= set(re.findall(r"\bset\(\s*(\w+)\s+[^)]*\bCACHE\b", cmake_text))
check("the project's CMake options were found", {"L3_CUDA", "L3_CUDA_ARCHS", "L3_BUILD_TESTS"} <= cmake_options,
      str(sorted(cmake_options)))


def cmake_args(**variants):
    values = {"cuda": False, "cuda_arch": ("none",), "tests": False, "build_type": "Release"}
    values.update(variants)
    args = Package(Spec(**values)).cmake_args()
    parsed = {}
    for arg in args:
        m = re.fullmatch(r"-D(\w+)(?::\w+)?=(.*)", arg)
        check(f"'{arg}' is a -DNAME=VALUE option", m is not None)
        if m:
            parsed[m.group(1)] = m.group(2)
    return parsed


for label, variants, expected in [
    ("~cuda ~tests", {}, {"L3_CUDA": "OFF", "L3_BUILD_TESTS": "OFF"}),
    ("+cuda cuda_arch=90", {"cuda": True, "cuda_arch": ("90",)}, {"L3_CUDA": "ON", "L3_CUDA_ARCHS": "90"}),
    ("+cuda cuda_arch=80,90 +tests", {"cuda": True, "cuda_arch": ("80", "90"), "tests": True},
     {"L3_CUDA": "ON", "L3_CUDA_ARCHS": "80;90", "L3_BUILD_TESTS": "ON"}),
]:
    args = cmake_args(**variants)
    unknown = sorted(set(args) - cmake_options)
    check(f"{label}: every option exists in CMakeLists.txt/cmake", not unknown, f"unknown: {unknown}")
    wrong = {k: (args.get(k), v) for k, v in expected.items() if args.get(k) != v}
    check(f"{label}: variants mapped ({expected})", not wrong, f"(got, expected): {wrong}")
    check(f"{label}: no CUDA architectures without CUDA", variants.get("cuda") or "L3_CUDA_ARCHS" not in args)

# ---- dependencies against what CMake looks for -----------------------------------------------
TOOLS = {"c", "cxx", "cmake", "pkgconfig"}  # build tools, not libraries CMake finds


def split_spec(spec):
    """'hdf5@1.10: +mpi' -> ('hdf5', {'+mpi'}); keeps boolean variants, drops versions."""
    name = re.match(r"[\w-]+", spec).group(0)
    return name, set(re.findall(r"\+\w+", spec[len(name):]))


package_deps = {}
for kind, args, kwargs, _ in own:
    if kind != "depends_on":
        continue
    name, flags = split_spec(args[0])
    if name not in TOOLS:
        package_deps[name] = (flags, kwargs.get("when"))

deps_file = os.path.join(build_dir, "l3-dependencies.txt")
recorded = {}
for line in open(deps_file, encoding="utf-8").read().split("\n"):
    if line.strip():
        spec, _, when = line.partition(" when ")
        name, flags = split_spec(spec)
        recorded[name] = (flags, when or None)
if not any(when == "+cuda" for _, when in recorded.values()):  # a build without CUDA
    for spec in re.findall(r'l3_record_dependency\("([^"]+)" "\+cuda"\)', cmake_text):
        recorded[split_spec(spec)[0]] = (split_spec(spec)[1], "+cuda")
    print("     (CUDA dependencies taken from cmake/L3Cuda.cmake: this build has no CUDA)")

check("CMake recorded its dependencies", len(recorded) >= 10, f"{deps_file}: {recorded}")
missing = sorted(set(recorded) - set(package_deps))
extra = sorted(set(package_deps) - set(recorded))
check("package.py depends on everything CMake looks for", not missing, f"missing: {missing}")
check("package.py depends on nothing CMake does not look for", not extra, f"extra: {extra}")
for name in sorted(set(recorded) & set(package_deps)):
    (want_flags, want_when), (flags, when) = recorded[name], package_deps[name]
    check(f"{name}: variants {sorted(want_flags) or '-'}, when {want_when or 'always'}",
          want_flags <= flags and want_when == when, f"package.py has {sorted(flags)} when {when}")
catch2 = [d for d in own if d[0] == "depends_on" and d[1][0].startswith("catch2")]
check("catch2 is a test dependency", bool(catch2) and "test" in catch2[0][2].get("type", ()), str(catch2))

# ---- language dependencies only where Spack knows them ---------------------------------------
# Spack 1.x requires c and cxx; 0.22 and 0.23 take those in spack.directives.SUPPORTED_LANGUAGES
# (0.23.0.dev0: cxx and fortran, not c: "Package 'c' not found"); older ones know neither.
directives_module = types.ModuleType("spack.directives")
spack_module.directives = directives_module
sys.modules["spack.directives"] = directives_module
for version_info, supported, expected in [
        ((0, 20, 0), None, []),
        ((0, 21, 2), None, []),
        ((0, 23, 0, "dev0"), ("fortran", "cxx"), ["cxx"]),
        ((0, 23, 1), ("fortran", "cxx", "c"), ["c", "cxx"]),
        ((1, 0, 0), None, ["c", "cxx"]),
        ((1, 1, "0"), None, ["c", "cxx"]),
        (None, None, ["c", "cxx"])]:
    if version_info is None:
        spack_module.__dict__.pop("spack_version_info", None)
    else:
        spack_module.spack_version_info = version_info
    if supported is None:
        directives_module.__dict__.pop("SUPPORTED_LANGUAGES", None)
    else:
        directives_module.SUPPORTED_LANGUAGES = supported
    start = len(directives)
    exec(compile(source, package_path, "exec"), {"__name__": "llama3_hpc_package"})
    languages = sorted(d[1][0] for d in directives[start:]
                       if d[0] == "depends_on" and d[3] == "Llama3Hpc" and d[1][0] in ("c", "cxx"))
    check(f"Spack {version_info or '(no version)'}: languages {expected}", languages == expected,
          str(languages))
spack_module.__dict__.pop("spack_version_info", None)
del sys.modules["spack.directives"]

# ---- with a real Spack, where there is one ---------------------------------------------------
if shutil.which("spack"):
    with tempfile.TemporaryDirectory() as config:
        env = dict(os.environ, SPACK_USER_CONFIG_PATH=config)
        added = subprocess.run(["spack", "repo", "add", os.path.join(source_dir, "spack")], env=env,
                               capture_output=True, text=True)
        info = subprocess.run(["spack", "info", "llama3-hpc"], env=env, capture_output=True, text=True)
        check("spack repo add + spack info", added.returncode == 0 and info.returncode == 0,
              added.stderr + info.stderr)
else:
    print("     (no spack on PATH: `spack repo add` / `spack info` not tried)")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
