#!/usr/bin/env bash
# A screenshot of the report of a run (a demo's workdir, or any run `llama3-hpc report` reads),
# for the docs: docs/images/demo-report.png is made with
#   scripts/demo.sh && scripts/report-screenshot.sh llama3-hpc-demo docs/images/demo-report.png
#
#   scripts/report-screenshot.sh WORKDIR OUT.png
#   L3_BUILD_DIR=build (where llama3-hpc is; else llama3-hpc on PATH)
#   L3_SCREENSHOT_SIZE=1280,1600 (the window: the summary and the first phase's charts)
# Needs Chromium (scripts/install-deps.sh --test-tools installs it).
set -euo pipefail
if [[ $# -ne 2 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
workdir=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${L3_BUILD_DIR:-$root/build}/bin/llama3-hpc
[[ -x "$bin" ]] || bin=$(command -v llama3-hpc || true)
[[ -n "$bin" ]] || { echo "report-screenshot.sh: no llama3-hpc (build it: scripts/build.sh)" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[[ -n "$browser" ]] || { echo "report-screenshot.sh: Chromium is not installed" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" report "$workdir" --output "$tmp/report.html" >/dev/null
# Chromium's D-Bus and GPU complaints in containers are harmless: kept out of sight.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --user-data-dir="$tmp/profile" --window-size="${L3_SCREENSHOT_SIZE:-1280,1600}" \
  --screenshot="$tmp/shot.png" "file://$tmp/report.html" >/dev/null 2>"$tmp/chromium.log" || {
  tail -5 "$tmp/chromium.log" >&2
  exit 1
}
[[ -s "$tmp/shot.png" ]] || { echo "report-screenshot.sh: Chromium wrote no screenshot" >&2; exit 1; }
mv "$tmp/shot.png" "$out"
echo "wrote $out ($(wc -c <"$out") bytes)"
