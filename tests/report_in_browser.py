#!/usr/bin/env python3
"""`loom report`'s page in a real browser: headless Chromium loads it from a file:// URL with no
network, and
  - the DOM it builds (--dump-dom) holds one <figure class="chart"> per metric, each with one
    <svg> whose lines have non-empty paths, and the pipeline timeline's <img>;
  - the screenshot is not blank: every chart that fits in the window has ink in its box (boxes
    measured by a copy of the page with a probe script: the page itself has no script), the first
    run's colour shows in the loss chart, and the page has many distinct colours;
  - the console stays clean: no uncaught error, no console error, no failed load.
Skipped (exit 77, ctest "Skipped") where Chromium is not installed.

Usage: report_in_browser.py LOOM_BINARY
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from html.parser import HTMLParser

SKIP = 77
WINDOW = (1280, 2000)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# The first run's colour (kChartPalette[0], matplotlib's tab10 blue) and how far a screenshot
# pixel may stray from it (anti-aliasing blends line edges with the white background).
RUN0_RGB = (0x1F, 0x77, 0xB4)
COLOUR_TOLERANCE = 40
# A chart is more than its frame: lines, ticks and text cover at least this share of its box.
MIN_INK_FRACTION = 0.01
MIN_PAGE_COLOURS = 50
EXPECTED_CHARTS = {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "mfu", "memory",
                   "comm_bytes", "comm_ms", "rank_compute_ms", "field_moe_aux_loss"}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def find_chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def write_run(directory, loss_offset, pipeline_svg):
    os.makedirs(directory)
    lines = []
    for step in range(1, 41):
        record = {"kind": "train", "step": step, "total_steps": 40,
                  "loss": loss_offset + 4.0 / (1 + 0.2 * step), "lr": 1e-3 * min(1.0, step / 10),
                  "grad_norm": 1.0 / step ** 0.5, "step_ms": 90.0 + step % 7,
                  "tokens_per_s": 1400.0 - step % 7 * 10, "mfu": 0.3 + 0.001 * step,
                  "memory_bytes": 40 << 20,
                  "memory_peak_bytes": {"parameters": 8 << 20, "gradients": 8 << 20,
                                        "optimizer_state": 16 << 20, "activations": 6 << 20},
                  "comm": {"all_reduce": {"calls": 4, "bytes_sent": 8 << 20, "bytes_received": 8 << 20}},
                  "comm_pp": {"send": {"calls": 8, "bytes_sent": (1 << 20) + step, "bytes_received": 1 << 20}},
                  "cp_exposed_comm_ms": 2.0 + step % 3, "moe_aux_loss": 0.01 + 0.001 * step,
                  "skipped_steps": 1 if step >= 17 else 0}
        if step == 17:
            record.update({"skipped": True, "bad_step": "loss spike <x5>"})
        if step % 10 == 0:
            record["rank_compute_ms"] = {"min": 80.0, "median": 85.0, "max": 95.0, "slowest_rank": 1}
        lines.append(json.dumps(record))
        if step % 10 == 0:
            lines.append(json.dumps({"kind": "val", "step": step, "val_loss": loss_offset + 4.2 / (1 + 0.2 * step)}))
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "run.json"), "w") as f:
        json.dump({"model": {"arch": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 64,
                             "parameters": 52000},
                   "layout": "tp=1 pp=2 dp=2 zero=1 mbs=4 recompute=none 1f1b", "world_size": 4,
                   "precision": "f32", "device": "cpu", "steps": 40, "tokens_per_step": 512}, f)
    if pipeline_svg:
        shutil.copy(pipeline_svg, os.path.join(directory, "pipeline.svg"))


class DomSummary(HTMLParser):
    """Per chart figure: its <svg> count and the d of each line; the timeline images."""

    def __init__(self):
        super().__init__()
        self.charts = {}
        self.current = None
        self.timeline_images = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure" and attrs.get("class") == "chart":
            self.current = attrs.get("id", "")
            self.charts[self.current] = {"svgs": 0, "paths": []}
        elif tag == "svg" and self.current is not None:
            self.charts[self.current]["svgs"] += 1
        elif tag == "path" and self.current is not None:
            self.charts[self.current]["paths"].append(attrs.get("d", ""))
        elif tag == "img" and (attrs.get("src") or "").startswith("data:image/svg+xml;base64,"):
            self.timeline_images.append(attrs["src"])

    def handle_endtag(self, tag):
        if tag == "figure":
            self.current = None


def decode_png(path):
    """8-bit RGB or RGBA, non-interlaced (what Chromium writes): rows of (r, g, b) tuples."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(path + " is not a PNG")
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour_type not in (2, 6) or interlace:
                fail(f"unexpected PNG format: depth {depth}, colour type {colour_type}, interlace {interlace}")
            channels = 3 if colour_type == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        filter_type = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # PNG spec, section 9: reconstruct each byte from its neighbours
            a = line[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if filter_type == 1:
                line[i] = (line[i] + a) & 0xFF
            elif filter_type == 2:
                line[i] = (line[i] + b) & 0xFF
            elif filter_type == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif filter_type == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return rows


def chromium(binary, profile, *args):
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--force-device-scale-factor=1",
               "--hide-scrollbars", "--user-data-dir=" + profile, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def main():
    loom = sys.argv[1]
    binary = find_chromium()
    if not binary:
        print("SKIP: Chromium is not installed (Debian: apt-get install chromium); "
              "the report page is not checked in a browser")
        return SKIP
    work = tempfile.mkdtemp(prefix="loom_report_browser_")
    try:
        profile = os.path.join(work, "profile")
        # A real pipeline timeline, as loom's own SVG code draws it (the planner's simulation).
        plan = subprocess.run([loom, "plan", "--model", "gpt2-124m", "--layout", "pp=2,dp=1,mbs=1",
                               "--global-batch", "8", "--seq", "256", "--svg", os.path.join(work, "plan")],
                              capture_output=True, text=True)
        timeline = os.path.join(work, "plan", "timeline.svg")
        if not os.path.exists(timeline):
            fail("loom plan drew no timeline.svg: " + plan.stdout + plan.stderr)
        runs = [os.path.join(work, "run <a>"), os.path.join(work, "run b")]
        write_run(runs[0], 0.0, timeline)
        write_run(runs[1], 0.4, None)
        page = os.path.join(work, "report.html")
        result = subprocess.run([loom, "report", *runs, "-o", page], capture_output=True, text=True)
        if result.returncode != 0:
            fail("loom report: " + result.stdout + result.stderr)
        print(result.stdout.strip())
        url = "file://" + page

        # The DOM as Chromium parsed it.
        dom = chromium(binary, profile, "--dump-dom", url)
        summary = DomSummary()
        summary.feed(dom.stdout)
        if set(summary.charts) != {"chart-" + c for c in EXPECTED_CHARTS}:
            fail(f"charts in the DOM: {sorted(summary.charts)}, expected {sorted(EXPECTED_CHARTS)}")
        for chart, found in summary.charts.items():
            lines = [d for d in found["paths"] if re.match(r"^M[\d.]+ [\d.]+( L[\d.]+ [\d.]+)+$", d)]
            if found["svgs"] != 1 or not lines:
                fail(f"{chart}: {found['svgs']} <svg>, {len(lines)} drawn lines (paths {found['paths'][:3]})")
        if len(summary.timeline_images) != 1:
            fail(f"{len(summary.timeline_images)} pipeline timeline images, expected 1")

        # The screenshot, with the console watched.
        shot = os.path.join(work, "shot.png")
        start = time.monotonic()
        render = chromium(binary, profile, "--enable-logging=stderr", "--v=0", "--screenshot=" + shot,
                          f"--window-size={WINDOW[0]},{WINDOW[1]}", url)
        render_s = time.monotonic() - start
        console = [l for l in render.stderr.splitlines() if ":CONSOLE" in l]
        bad = [l for l in console if re.search(r"Uncaught|ERROR:CONSOLE|Failed to load|net::ERR", l)]
        if bad:
            fail("console errors:\n" + "\n".join(bad))
        if not os.path.exists(shot):
            fail("no screenshot: " + render.stderr[-2000:])

        # Where each chart sits: a copy of the page with a probe script writes the boxes into
        # the DOM (the page itself has no script).
        probe = os.path.join(work, "probe.html")
        with open(page) as f:
            html = f.read()
        script = ("<script>const boxes={};for(const f of document.querySelectorAll('figure.chart')){"
                  "const r=f.getBoundingClientRect();boxes[f.id]=[r.left,r.top,r.width,r.height];}"
                  "const p=document.createElement('pre');p.id='boxes';p.textContent=JSON.stringify(boxes);"
                  "document.body.appendChild(p);</script>")
        with open(probe, "w") as f:
            f.write(html.replace("</body>", script + "</body>"))
        probed = chromium(binary, profile, "--dump-dom", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                          "file://" + probe)
        match = re.search(r'<pre id="boxes">(.*?)</pre>', probed.stdout, re.S)
        if not match:
            fail("the probe found no chart boxes")
        boxes = json.loads(match.group(1).replace("&quot;", '"'))

        pixels = decode_png(shot)
        height, width = len(pixels), len(pixels[0])
        colours = {p for row in pixels for p in row}
        if len(colours) < MIN_PAGE_COLOURS:
            fail(f"the screenshot has {len(colours)} distinct colours, expected at least {MIN_PAGE_COLOURS}")
        checked = 0
        for chart, (left, top, box_width, box_height) in sorted(boxes.items(), key=lambda kv: kv[1][1]):
            x0, y0 = int(left), int(top)
            x1, y1 = int(left + box_width), int(top + box_height)
            if x1 > width or y1 > height:
                continue  # below the window: not in the screenshot
            region = [pixels[y][x] for y in range(y0, y1) for x in range(x0, x1)]
            ink = sum(1 for p in region if min(p) < 235) / len(region)
            if ink < MIN_INK_FRACTION:
                fail(f"{chart} at {x0},{y0} {x1 - x0}x{y1 - y0}: {100 * ink:.2f}% ink, looks blank")
            if chart == "chart-loss" and not any(
                    all(abs(a - b) <= COLOUR_TOLERANCE for a, b in zip(p, RUN0_RGB)) for p in region):
                fail("the loss chart shows no pixel of the first run's colour")
            checked += 1
        if checked < 4:
            fail(f"only {checked} charts fit in the {WINDOW[0]}x{WINDOW[1]} window; boxes {boxes}")
        print(f"OK: {len(summary.charts)} charts in the DOM, {checked} checked for ink in a "
              f"{width}x{height} screenshot with {len(colours)} colours; page {os.path.getsize(page)} bytes; "
              f"chromium screenshot {render_s:.2f} s; console lines {len(console)}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
