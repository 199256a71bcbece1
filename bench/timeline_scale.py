"""Timeline and trace size at scale (issue 18, item 6): grouped pages stay small and render.

For unfolded runs of growing size (64, 1,024 and 10,240 GPUs; `--quick`: 64 and 1,024 with a
smaller batch) it simulates one iteration with every GPU its own rank (`api.simulate(...,
unfold=True)`, what `sim simulate --unfold` runs), then writes what `sim simulate --timeline
--trace` writes: the HTML timeline (grouped past 32 ranks, with `--timeline-rank` of the last
GPU drawn in full) and the Chrome trace (one representative rank per stage group). It prints
one table — GPUs, ranks simulated, ranks the page shows, HTML size, trace size and ranks in it, time
to simulate, to write the page and the trace, and to screenshot the page in headless Chromium
— then the PNG paths. Screenshots need `chromium` (Debian: `apt-get install chromium`); without
it the column reads "-".

Usage: `python bench/timeline_scale.py [--quick] [--out DIR] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CASES: dict[str, list[dict[str, Any]]] = {
    "full": [
        {"model": "gpt3-1.3b", "cluster": "8x8xA100-SXM4-80GB", "tp": 2, "pp": 4, "dp": 8,
         "global_batch": 64},
        {"model": "gpt3-175b", "cluster": "128x8xA100-SXM4-80GB", "tp": 8, "pp": 16, "dp": 8,
         "global_batch": 1536, "micro_batch_size": 1, "recompute": "full"},
        {"model": "gpt3-175b", "cluster": "1280x8xA100-SXM4-80GB", "tp": 8, "pp": 16, "dp": 80,
         "global_batch": 2560, "micro_batch_size": 1, "recompute": "full"},
    ],
    "quick": [
        {"model": "gpt3-1.3b", "cluster": "8x8xA100-SXM4-80GB", "tp": 2, "pp": 4, "dp": 8,
         "global_batch": 64},
        {"model": "gpt3-175b", "cluster": "128x8xA100-SXM4-80GB", "tp": 8, "pp": 16, "dp": 8,
         "global_batch": 256, "micro_batch_size": 1, "recompute": "full"},
    ],
}

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html: Path, png: Path) -> float | None:
    """Seconds headless Chromium takes to load, draw and screenshot `html` (None: no chromium)."""
    if CHROMIUM is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.perf_counter()
        subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1600,1000",
             "--virtual-time-budget=10000", html.as_uri()],
            check=True, capture_output=True, timeout=600,
        )
        return time.perf_counter() - t0


def run_case(case: dict[str, Any], out: Path) -> dict[str, Any]:
    """Simulate one case unfolded, write its page and trace, screenshot the page."""
    from trainsim import api
    from trainsim.simulator.chrome_trace import write_chrome_trace
    from trainsim.simulator.timeline_groups import default_trace_groups, rank_groups
    from trainsim.simulator.timeline_plot import write_timeline_html

    fields = {k: v for k, v in case.items() if k not in ("model", "cluster")}
    spec, hw = api.load_model(case["model"]), api.load_cluster(case["cluster"])
    plan = api.make_plan(spec, hw, None, **fields)
    t0 = time.perf_counter()
    result = api.simulate(spec, hw, plan, unfold=True)
    sim_s = time.perf_counter() - t0
    gpus = plan.gpus
    stem = f"timeline_{gpus}gpus"
    html, trace, png = out / f"{stem}.html", out / f"{stem}.json", out / f"{stem}.png"
    focus = gpus - 1
    t0 = time.perf_counter()
    write_timeline_html(result, html, focus_rank=focus)
    html_s = time.perf_counter() - t0
    groups = rank_groups(result)
    t0 = time.perf_counter()
    chosen, _ = default_trace_groups(result)
    reps = None if chosen is None else [g.representative for g in chosen]
    write_chrome_trace(result, trace, ranks=reps)
    trace_s = time.perf_counter() - t0
    shot_s = screenshot(html, png)
    return {
        "model": case["model"], "gpus": gpus, "ranks": len(result.ranks),
        "tasks": result.program.num_tasks,
        "ranks_shown": len(groups) + 1 if len(result.ranks) > 32 else len(result.ranks),
        "html_mb": html.stat().st_size / 1e6, "trace_mb": trace.stat().st_size / 1e6,
        "trace_ranks": len(result.ranks) if reps is None else len(reps),
        "simulate_s": sim_s, "write_html_s": html_s, "write_trace_s": trace_s,
        "screenshot_s": shot_s, "html": str(html), "trace": str(trace),
        "png": str(png) if shot_s is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 1,024 GPUs, small batch")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "timeline_scale",
                        help="folder for the pages, traces and screenshots")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run_case(case, args.out) for case in CASES["quick" if args.quick else "full"]]
    if args.json:
        print(json.dumps({"cases": rows}, indent=2))
        return
    head = ("model", "GPUs", "ranks", "tasks", "ranks shown", "HTML MB", "trace MB",
            "trace ranks", "simulate s", "write HTML s", "write trace s", "screenshot s")
    table = [
        (r["model"], str(r["gpus"]), str(r["ranks"]), f"{r['tasks']:,}", str(r["ranks_shown"]),
         f"{r['html_mb']:.2f}", f"{r['trace_mb']:.2f}", str(r["trace_ranks"]),
         f"{r['simulate_s']:.1f}", f"{r['write_html_s']:.2f}", f"{r['write_trace_s']:.2f}",
         "-" if r["screenshot_s"] is None else f"{r['screenshot_s']:.1f}")
        for r in rows
    ]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for t in table:
        print("  ".join(c.rjust(w) for c, w in zip(t, widths)))
    print("ranks shown: ranks the page draws rows of (one representative per rank group, plus "
          "the --timeline-rank drill-down: the last GPU)")
    for r in rows:
        if r["png"]:
            print(f"screenshot: {r['png']}")


if __name__ == "__main__":
    main()
