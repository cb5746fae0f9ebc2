#!/usr/bin/env bash
# `llama3-hpc report` seen by a browser: headless Chromium loads the page of two synthetic runs
# (tests/support/report_runs.py); its DOM must hold each phase's section with its charts, and
# its screenshot must be a real image of the window's size, with the charts drawn in the runs'
# colours. SKIP (77) without Chromium (scripts/install-deps.sh --test-tools installs it).
#   report_chromium_test.sh PATH/TO/llama3-hpc
set -uo pipefail
bin=${1:?usage: report_chromium_test.sh LLAMA3_HPC}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
browser=""
for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then
    browser=$(command -v "$name")
    break
  fi
done
if [[ -z "$browser" ]]; then
  echo "SKIP: no chromium, chromium-browser or google-chrome on PATH (scripts/install-deps.sh --test-tools installs chromium)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/support/cli_checks.sh
source "$(dirname "$0")/../support/cli_checks.sh"

mkdir -p "$work/t"
python3 "$(dirname "$0")/../support/report_runs.py" "$work/t/runs"
run "the report" 0 "$bin" report "$work/t/runs/a" "$work/t/runs/b/metrics.jsonl" \
  --output "$work/t/report.html"

# Chromium prints D-Bus and GPU complaints on stderr in containers: harmless, kept in a file.
# Its own profile directory: nothing of the user's is read or written.
chrome() {
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --no-first-run --user-data-dir="$work/profile" "$@" 2>>"$work/chromium.log"
}
chrome --dump-dom "file://$work/t/report.html" >"$work/dom.html"
expect "chromium dumped the DOM" [ -s "$work/dom.html" ]
dom=$(python3 - "$work/dom.html" <<'EOF'
import sys
from html.parser import HTMLParser

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.section, self.charts = None, {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("data-phase")
            self.charts.setdefault(self.section, 0)
        if tag == "svg" and "chart" in (a.get("class") or "").split() and self.section:
            if a.get("data-phase") == self.section:
                self.charts[self.section] += 1
    def handle_endtag(self, tag):
        if tag == "section":
            self.section = None

dom = Dom()
dom.feed(open(sys.argv[1], encoding="utf-8").read())
print(" ".join("%s=%d" % kv for kv in dom.charts.items()))
EOF
)
expect "each phase's section holds its charts in the DOM ($dom)" [ "$dom" = "sft=5 reward=7" ]

width=1280
height=1000
chrome --screenshot="$work/shot.png" --window-size="$width,$height" "file://$work/t/report.html" \
  >/dev/null
expect "chromium took a screenshot" [ -s "$work/shot.png" ]
# The PNG decoded (IHDR, the IDAT stream, the row filters): its size, and its colours.
image=$(python3 - "$work/shot.png" "$width" "$height" <<'EOF'
import struct
import sys
import zlib

data = open(sys.argv[1], "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(print("not a PNG"))
pos, idat, ihdr = 8, b"", None
while pos + 8 <= len(data):
    (n,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b"IHDR":
        ihdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
width, height, depth, colour_type, _, _, interlace = ihdr
problems = []
if (width, height) != (int(sys.argv[2]), int(sys.argv[3])):
    problems.append("%dx%d, expected %sx%s" % (width, height, sys.argv[2], sys.argv[3]))
if depth != 8 or colour_type not in (2, 6) or interlace:
    sys.exit(print("an 8-bit RGB(A) non-interlaced PNG expected, got %s" % (ihdr,)))
bpp = 3 if colour_type == 2 else 4
stride = width * bpp
raw = zlib.decompress(idat)
if len(raw) != height * (stride + 1):
    sys.exit(print("IDAT holds %d bytes, expected %d" % (len(raw), height * (stride + 1))))
colours, white, previous = {}, 0, bytearray(stride)
for y in range(height):
    kind = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if kind == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 255
    elif kind == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, previous))
    elif kind == 3:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + (left + previous[i]) // 2) & 255
    elif kind == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for i in range(0, stride, bpp):
        pixel = bytes(line[i:i + 3])
        colours[pixel] = colours.get(pixel, 0) + 1
    previous = line
white = colours.get(b"\xff\xff\xff", 0) / (width * height)
if len(colours) < 50:
    problems.append("only %d distinct colours" % len(colours))
if not 0.5 < white < 0.995:
    problems.append("%.1f%% white" % (100 * white))
# The runs' colours (phase_charts.cpp's palette): the first run's curves, the second's.
for name, rgb in (("blue", (31, 119, 180)), ("orange", (255, 127, 14))):
    if colours.get(bytes(rgb), 0) < 20:
        problems.append("no %s curves (%d pixels)" % (name, colours.get(bytes(rgb), 0)))
print("; ".join(problems) if problems else "ok")
EOF
)
expect "the screenshot is the page drawn ($image)" [ "$image" = ok ]

# The summary fits a 1280-pixel window, nothing to scroll sideways, with long run names and a
# long model path: a script added to a copy of the page measures the table's box.
for name in sft-llama3.1-8b-instruct-lr3e-5-zero3-lora-r16-alpha32-seed1234 \
  sft-llama3.1-8b-instruct-lr1e-5-zero3-full-finetune-baseline-seed1234; do
  cp -r "$work/t/runs/a" "$work/t/$name"
  sed -i 's|"model": "tiny"|"model": "/scratch/project_465000123/models/Meta-Llama-3.1-8B-Instruct-long-name"|' \
    "$work/t/$name"/*.jsonl
done
run "a report of long names" 0 "$bin" report "$work/t"/sft-* --output "$work/t/wide.html"
sed 's|</body>|<script>const d = document.querySelector("div.table"); document.body.dataset.fits = d.scrollWidth <= d.clientWidth \&\& document.documentElement.scrollWidth <= 1280 ? "ok" : d.scrollWidth + " px in " + d.clientWidth;</script></body>|' \
  "$work/t/wide.html" >"$work/t/measured.html"
fits=$(chrome --window-size=1280,800 --dump-dom "file://$work/t/measured.html" |
  grep -o 'data-fits="[^"]*"')
expect "the summary fits a 1280-pixel window ($fits)" [ "$fits" = 'data-fits="ok"' ]

if [[ $failures -gt 0 ]]; then
  echo "chromium's stderr, last lines:"
  tail -20 "$work/chromium.log"
fi
finish_cli_checks "report checks in Chromium"
