"""The plotly timeline: figure layout, self-contained deterministic HTML, and a headless-Chromium
screenshot that is not blank."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from trainsim.simulator.engine_simpy import run_simpy
from trainsim.simulator.random_program import random_program
from trainsim.simulator.timeline_plot import (
    DIV_ID,
    KIND_COLOURS,
    timeline_figure,
    write_timeline_html,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _result():
    return run_simpy(random_program(5, 4, 300))


def test_figure_has_one_bar_trace_per_kind_and_three_panels() -> None:
    """Bars: one horizontal trace per task kind, overlaid with base = start; rows rank × stream;
    then one memory and one power line per rank on a shared time axis."""
    result = _result()
    fig = timeline_figure(result)
    bars = [t for t in fig.data if t.type == "bar"]
    assert sorted(t.name for t in bars) == sorted(result.tasks["kind"].unique())
    assert sum(len(t.x) for t in bars) == len(result.tasks)
    assert all(t.orientation == "h" for t in bars)
    assert fig.layout.barmode == "overlay"
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == 2 * result.program.num_ranks
    assert {t.xaxis for t in fig.data} == {"x", "x2", "x3"}
    assert fig.layout.xaxis.matches == "x3" or fig.layout.xaxis2.matches == "x3"
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows[0].startswith("rank 0 · compute")


def test_hover_carries_task_details() -> None:
    """Hover text shows name, micro-batch, start, duration, bytes and frequency."""
    fig = timeline_figure(_result())
    bar = next(t for t in fig.data if t.type == "bar")
    for word in ("micro-batch", "start", "duration", "bytes", "frequency"):
        assert word in bar.hovertemplate
    assert len(bar.customdata[0]) == 6


def test_html_is_self_contained_and_byte_identical(tmp_path: Path) -> None:
    """plotly.js is inlined (no script src, works offline), the div id is fixed, and two writes of
    the same result are byte-identical."""
    result = _result()
    first = write_timeline_html(result, tmp_path / "a.html").read_bytes()
    second = write_timeline_html(result, tmp_path / "b.html").read_bytes()
    assert first == second
    text = first.decode()
    assert re.findall(r"<script[^>]*\bsrc=", text) == []
    assert f'id="{DIV_ID}"' in text
    assert "Plotly.newPlot" in text and len(first) > 1_000_000  # plotly.js is in the file


def _decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """Minimal PNG decoder (8-bit RGB/RGBA, non-interlaced): (width, height, channels, pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    out, prev = bytearray(), bytearray(stride)
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else up_left
                line[i] = (line[i] + pred) & 0xFF
        out += line
        prev = line
    return width, height, channels, bytes(out)


def _screenshot(html: Path, tmp_path: Path, name: str) -> tuple[int, int, int, bytes]:
    """Headless Chromium's 1400×900 screenshot of `html`, decoded."""
    png = tmp_path / f"{name}.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            "--window-size=1400,900",
            "--virtual-time-budget=5000",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return _decode_png(png.read_bytes())


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    """A screenshot of the timeline in headless Chromium is not blank: many distinct colours
    (bars in several kind colours, lines, text), not a uniform page."""
    html = write_timeline_html(_result(), tmp_path / "timeline.html")
    width, height, channels, pixels = _screenshot(html, tmp_path, "shot")
    assert (width, height) == (1400, 900)
    colours = {pixels[i : i + 3] for i in range(0, len(pixels), channels * 7)}
    assert len(colours) > 20


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_grouped_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The grouped page of an unfolded 64-GPU run (one row set per stage, a drill-down rank,
    capacity line) renders in headless Chromium: bars in the kind colours, not a blank page."""
    from trainsim import api

    spec, hw = api.load_model("gpt3-125m"), api.load_cluster("8x8xA100-SXM4-80GB")
    plan = api.make_plan(spec, hw, None, tp=2, pp=4, dp=8, global_batch=32, seq_len=256)
    result = api.simulate(spec, hw, plan, unfold=True)
    html = write_timeline_html(result, tmp_path / "grouped.html", focus_rank=63)
    assert html.stat().st_size < 20e6
    width, height, channels, pixels = _screenshot(html, tmp_path, "grouped")
    assert (width, height) == (1400, 900)
    colours = {pixels[i : i + 3] for i in range(0, len(pixels), channels * 7)}
    assert len(colours) > 20
    forward = bytes(int(KIND_COLOURS["forward"][i : i + 2], 16) for i in (1, 3, 5))
    backward = bytes(int(KIND_COLOURS["backward"][i : i + 2], 16) for i in (1, 3, 5))
    assert forward in colours and backward in colours
