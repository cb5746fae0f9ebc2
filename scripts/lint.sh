#!/usr/bin/env bash
# Style and static analysis: clang-format (as the lint/clang_format test does) and clang-tidy
# over every C++ file of the build (build/compile_commands.json). Exit 1 on any finding.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${L3_BUILD_DIR:-$root/build}
bash "$root/tests/lint/format_check.sh" "$root"
[[ -f "$build/compile_commands.json" ]] || "$root/scripts/build.sh"
mapfile -t files < <(cd "$root" && git ls-files -co --exclude-standard -- '*.cpp')
out=$(mktemp)
trap 'rm -f "$out"' EXIT
printf '%s\n' "${files[@]}" | (cd "$root" && xargs -P "${L3_JOBS:-2}" -n 4 \
  clang-tidy -p "$build" --quiet 2>/dev/null) >"$out" || true
if grep -E "(warning|error):" "$out"; then
  echo "clang-tidy: findings above"
  exit 1
fi
echo "clang-tidy: ${#files[@]} files clean"
