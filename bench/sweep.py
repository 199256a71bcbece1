"""`sim sweep` at the size of the issue's goal: 1,000 scenarios on 2 local worker processes.

The spec: 2 models (GPT-3 1.3B, 2.7B) × 2 clusters (4 V100s, 8 A100s) × 5 plan shapes (the
default, pp 2, pp 4, tp 2, tp 2 × pp 2; data parallelism takes the rest of the GPUs) × knobs
global batch {32, 64, 128, 256, 512} × micro-batch size {1, 2, 4, 8, 16} × recompute {none,
full} = 1,000 scenarios, some of them OOM or invalid (a micro-batch that does not divide the
batch) on purpose: those are rows too.

Printed: the one-shot run's wall time and scenarios/s with `--workers` local processes
(default 2), its rows, failures and OOMs; the rerun of the same command (every key already in
the table: nothing computed); a run stopped after half the scenarios, then resumed, which
computes only the other half and writes the same table, row for row; and the dashboard's
time and size.

Usage: ``python bench/sweep.py [--workers N]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from trainsim import api

SPEC = {
    "description": "bench/sweep.py: 1,000 scenarios",
    "models": ["gpt3-1.3b", "gpt3-2.7b"],
    "clusters": ["4xV100-SXM2-32GB", "8xA100-SXM4-40GB"],
    "plans": [{}, {"pp": 2}, {"pp": 4}, {"tp": 2}, {"tp": 2, "pp": 2}],
    "knobs": {"global_batch": [32, 64, 128, 256, 512],
              "micro_batch_size": [1, 2, 4, 8, 16],
              "recompute": ["none", "full"]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    table = Table(title=f"sim sweep: 1,000 scenarios, local executor, {args.workers} workers")
    for col in ("run", "wall (s)", "scenarios/s", "computed", "skipped", "rows", "failed",
                "OOM"):
        table.add_column(col, justify="left" if col == "run" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep.parquet"

        def timed(name: str, path: Path, **options: int) -> api.SweepRun:
            start = time.perf_counter()
            run = api.sweep(SPEC, path, workers=args.workers, **options)
            wall = time.perf_counter() - start
            table.add_row(name, f"{wall:.2f}",
                          f"{run.computed / wall:,.0f}" if run.computed else "-",
                          str(run.computed), str(run.skipped), str(run.rows), str(run.failed),
                          str(run.oom))
            return run

        first = timed("one shot", out)
        assert first.total == 1000 and first.finished
        timed("rerun (all skipped)", out)
        half = Path(tmp) / "half.parquet"
        timed("stopped after 500", half, limit=500)
        resumed = timed("resumed", half)
        assert resumed.computed == 500
        same = pq.read_table(out).equals(pq.read_table(half), check_metadata=True)
        start = time.perf_counter()
        page = api.sweep_report(out, Path(tmp) / "sweep.html")
        report_s, report_mb = time.perf_counter() - start, page.stat().st_size / 1e6
    Console(width=120).print(table)
    print(f"resumed table equals the one-shot table row for row: {same}")
    print(f"sim sweep report of the 1,000 rows: {report_s:.2f} s, {report_mb:.1f} MB page")


if __name__ == "__main__":
    main()
