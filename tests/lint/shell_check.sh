#!/usr/bin/env bash
# The shell scripts users and CI run (Slurm job scripts, setup, CI) pass shellcheck.
# Skips (77) without shellcheck (scripts/install-deps.sh --test-tools installs it).
set -euo pipefail
root=${1:?usage: shell_check.sh SOURCE_DIR}
cd "$root"
command -v shellcheck >/dev/null || { echo "SKIP: shellcheck not installed"; exit 77; }
files=(jobs/*.sbatch jobs/*.sh scripts/*.sh tests/*/*.sh tools/*.sh .ci/run)
shellcheck -x -P jobs "${files[@]}"
echo "shellcheck: ${#files[@]} files clean"
