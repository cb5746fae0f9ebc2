#!/usr/bin/env bash
# The installed package as a host application meets it: `cmake --install` into a temporary
# prefix, the examples (examples/) configured with find_package(llama3_hpc) against that prefix
# and built, a C host built with pkg-config and mpicc, then each run under mpiexec -n 4.
#
#   install_test.sh SOURCE_DIR BUILD_DIR MPIEXEC
set -uo pipefail
source_dir=$1 build_dir=$2 mpiexec=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/l3-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
failures=0
export OMP_NUM_THREADS=1
fail() {
  echo "FAIL [$1]"
  failures=$((failures + 1))
}
check() {
  local name=$1
  shift
  if "$@"; then echo "ok   [$name]"; else fail "$name"; fi
}

cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 || {
  cat "$work/install.log"
  echo "cmake --install failed"
  exit 1
}
libdir=lib
for candidate in lib lib64 "lib/$(gcc -print-multiarch 2>/dev/null)"; do
  if [[ -e $prefix/$candidate/libllama3_hpc.so ]]; then
    libdir=$candidate
    break
  fi
done
check "the shared library with its SONAME" test -e "$prefix/$libdir/libllama3_hpc.so.0.1"
check "the headers" test -f "$prefix/include/l3/l3.hpp" -a -f "$prefix/include/l3/l3.h"
check "the CMake package" test -f "$prefix/$libdir/cmake/llama3_hpc/llama3_hpcConfig.cmake"
check "the pkg-config file" test -f "$prefix/$libdir/pkgconfig/llama3_hpc.pc"
check "the program" test -x "$prefix/bin/llama3-hpc"
for job in "$source_dir"/jobs/*; do
  check "the job script $(basename "$job") is installed" test -f "$prefix/share/llama3-hpc/jobs/$(basename "$job")"
done
check "the job scripts are executable" test -x "$prefix/share/llama3-hpc/jobs/dpo.sbatch"
check "the docs and examples" test -f "$prefix/share/doc/llama3_hpc/embedding.md" -a \
  -f "$prefix/share/doc/llama3_hpc/examples/two_sessions.cpp"
soname=$(readelf -d "$prefix/$libdir/libllama3_hpc.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
check "SONAME libllama3_hpc.so.0.1 ($soname)" test "$soname" = libllama3_hpc.so.0.1
# Only the API is exported: no function or object of an internal namespace (core, train, model,
# ...) is visible. Not counted: GCC's target_clones dispatchers (type i, "[clone .resolver]"),
# which it always exports, and typeinfo of std templates instantiated on internal types.
internal=$(nm -D --defined-only -C "$prefix/$libdir/libllama3_hpc.so" |
  awk '$2 != "i" { $1 = ""; $2 = ""; print }' | grep -v '\[clone .resolver\]' |
  grep -E '^ *l3::(core|dist|train|model|ckpt|data|api|prep|tokenizer|kernels|cli)::' | head -n 3)
check "internal symbols hidden${internal:+ (found: $internal)}" test -z "$internal"

# The examples against the installed package.
cmake -S "$source_dir/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/examples.log" 2>&1 &&
  cmake --build "$work/examples" -j2 >>"$work/examples.log" 2>&1
check "the examples configure (find_package) and build" test -x "$work/examples/two_sessions"
[[ $failures -eq 0 ]] || tail -30 "$work/examples.log"
# docs/embedding.md's find_package lines, as written, in a C++-only and in a C-only project (a
# C++ project has no C compiler for FindMPI's C component, and the other way round).
# shellcheck disable=SC2016  # backquotes and $ are sed's, not the shell's
snippet=$(sed -n '/^```cmake$/,/^```$/p' "$source_dir/docs/embedding.md" | sed '1d;$d' | head -n 2)
for language in CXX C; do
  project=$work/only-$language
  mkdir -p "$project"
  source_file=host.cpp
  [[ $language == C ]] && source_file=host.c
  {
    echo "cmake_minimum_required(VERSION 3.24)"
    echo "project(only_$language LANGUAGES $language)"
    echo "add_executable(my_host $source_file)"
    printf '%s\n' "$snippet"
  } >"$project/CMakeLists.txt"
  if [[ $language == CXX ]]; then
    printf '#include <l3/l3.hpp>\n#include <iostream>\nint main() { std::cout << l3::version() << "\\n"; }\n' >"$project/host.cpp"
  else
    printf '#include <l3/l3.h>\n#include <stdio.h>\nint main(void) { printf("%%s\\n", l3_version()); return 0; }\n' >"$project/host.c"
  fi
  cmake -S "$project" -B "$project/build" -DCMAKE_PREFIX_PATH="$prefix" >"$project/log" 2>&1 &&
    cmake --build "$project/build" >>"$project/log" 2>&1
  check "embedding.md's find_package in a $language-only project" test -x "$project/build/my_host"
  [[ -x $project/build/my_host ]] || tail -20 "$project/log"
  if [[ -x $project/build/my_host ]]; then
    check "it runs" test "$("$project/build/my_host" 2>/dev/null)" = "$("$prefix/bin/llama3-hpc" --version | head -1 | cut -d' ' -f2)"
  fi
done

# The C host once more, with pkg-config and the MPI compiler wrapper.
if command -v pkg-config >/dev/null && command -v mpicc >/dev/null; then
  # shellcheck disable=SC2046  # pkg-config's output is meant to be split
  PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" mpicc -std=c99 -o "$work/c_host_pc" \
    "$source_dir/examples/c_host.c" $(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs llama3_hpc) \
    >"$work/pc.log" 2>&1
  check "the C host builds with pkg-config and mpicc" test -x "$work/c_host_pc"
  [[ -x $work/c_host_pc ]] || cat "$work/pc.log"
fi

# A dataset, made with the installed program.
for i in $(seq 1 60); do
  w="word$((i % 9))"
  printf '{"prompt":"Reverse %s.","completion":"%s"}\n' "$w" "$(echo "$w" | rev)"
done >"$work/sft.jsonl"
"$prefix/bin/llama3-hpc" prep sft --input "$work/sft.jsonl" --tokenizer bytes --output "$work/data" \
  >/dev/null 2>&1
check "prep with the installed program" test -f "$work/data/index.json"

run() {  # run NAME EXPECTED-OUTPUT-REGEX COMMAND...
  local name=$1 expect=$2
  shift 2
  if timeout -k 5 240 "$@" >"$work/run.out" 2>&1 && grep -qE "$expect" "$work/run.out"; then
    echo "ok   [$name]"
  else
    fail "$name"
    tail -15 "$work/run.out"
  fi
}
if [[ -x $work/examples/two_sessions ]]; then
  run "two_sessions: two halves train side by side with different seeds" \
    "half 1: 8 steps on 2 ranks, seed 1001" \
    "$mpiexec" -n 4 "$work/examples/two_sessions" "$work/data" "$work/out"
  grep -q "half 0: 8 steps on 2 ranks, seed 1000" "$work/run.out" || fail "two_sessions: half 0"
  run "memory_data: a DataSource feeds the session and it learns" "memory_data: 40 steps on 4 ranks" \
    "$mpiexec" -n 4 "$work/examples/memory_data" 40
  run "c_host: the C API, with a requested checkpoint" "final checkpoint .*step-00000006" \
    "$mpiexec" -n 4 "$work/examples/c_host" "$work/data" "$work/c-ckpt"
  grep -q "checkpoint .*step-00000003" "$work/run.out" || fail "c_host: the checkpoint requested at step 3"
fi
if [[ -x $work/c_host_pc ]]; then
  run "c_host built with pkg-config" "final checkpoint" \
    "$mpiexec" -n 4 "$work/c_host_pc" "$work/data" "$work/c-ckpt-pc"
fi

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
