#!/usr/bin/env bash
# The sources follow .clang-format. Skips (77) without clang-format 14, the version the style
# was written for: other versions format some constructs differently.
set -euo pipefail
root=${1:?usage: format_check.sh SOURCE_DIR}
cd "$root"
command -v clang-format >/dev/null || { echo "SKIP: clang-format not installed"; exit 77; }
major=$(clang-format --version | grep -o 'version [0-9]*' | grep -o '[0-9]*')
[[ "$major" == 14 ]] || { echo "SKIP: clang-format $major found, the style is checked with 14"; exit 77; }
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' 2>/dev/null \
                     || find src kernels io include tests bench -name '*.[ch]pp' -o -name '*.cu')
[[ ${#files[@]} -gt 0 ]] || { echo "no sources found"; exit 1; }
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
clang-format --dry-run --Werror "${existing[@]}"
echo "clang-format: ${#existing[@]} files clean"
