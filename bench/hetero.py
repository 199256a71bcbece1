"""Heterogeneous planning on FASOP's cases (issue 14): Megatron-uniform vs FASOP vs ours.

For each of FASOP's models on its cluster (HPDC'24; AvatarHwang/FASOP, FASOP/FASOP.py and
device_placement.py: 4 GPUs per node, one A100 node and the rest A10 nodes), three planners
search the same degree and micro-batch grid on the same Oracle:

* uniform -- Megatron-LM: even layer and batch split, nodes in the order the cluster is written;
* fasop   -- FASOP's cyclic node rotations and min-max partition, 1F1B, no recompute;
* hetero  -- ours: every distinct node order, the exact partition (plus FASOP's and the even
  one), speed-proportional batch split, recompute none/full, 1F1B and ZB-H1, branch and bound,
  then one-layer moves on the Oracle;
* hetero-1f1b -- ours without the ZB-H1 schedule, so the table separates what heterogeneity-
  aware placement and partition give from what the zero-bubble schedule adds.

Printed per case and planner: best plan, iteration time, $ per 1M tokens (catalog prices per
GPU-hour), evaluations and search time; then the gains; then the GPT-2 XL Pareto sweep
(A100:0..8x8, A10:0..8x4; its size, wall time, front, and any mixed cluster that is cheaper per
token than both of its homogeneous halves).

Usage: ``python bench/hetero.py [--quick]`` (--quick: BERT-345M only, no sweep).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from trainsim import api
from trainsim.search.hetero.pareto import pareto_mask
from trainsim.search.hetero.planner import HeteroPlanner
from trainsim.search.hetero.sweep import beats_halves
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchResult, SearchSpec, run_search

CASES = [  # (model, cluster, global batch): FASOP's model_config.py / device_placement.py
    ("gpt2-xl", "1x4xA100-SXM4-40GB+7x4xA10", 64),
    ("bert-345m", "1x4xA100-SXM4-40GB+3x4xA10", 64),
    ("t5-fasop", "1x4xA100-SXM4-40GB+7x4xA10", 128),
]
PLANNERS: dict[str, dict[str, Any]] = {
    "uniform": {"name": "uniform"},
    "fasop": {"name": "fasop"},
    "hetero-1f1b": {"name": "hetero", "schedules": ("1f1b",)},
    "hetero": {"name": "hetero"},
}


def run_case(model: str, cluster: str, batch: int) -> dict[str, tuple[SearchResult, float,
                                                                       HeteroPlanner]]:
    spec, hw = api.load_model(model), api.load_cluster(cluster)
    out = {}
    for label, options in PLANNERS.items():
        planner = HeteroPlanner(**options)
        t0 = time.perf_counter()
        result = run_search(planner, SearchSpec(model=spec, cluster=hw, global_batch=batch,
                                                time_budget_s=600),
                            oracle=Oracle(spec, hw))
        out[label] = (result, time.perf_counter() - t0, planner)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    console = Console(width=200)
    cases = CASES[1:2] if args.quick else CASES
    gains = Table(title="gains of the best plans (iteration time ratios)")
    for col in ("model", "cluster", "uniform/hetero", "fasop/hetero", "uniform/fasop",
                "uniform/hetero-1f1b"):
        gains.add_column(col, justify="left" if col in ("model", "cluster") else "right")
    for model, cluster, batch in cases:
        results = run_case(model, cluster, batch)
        table = Table(title=f"{model} on {cluster}, global batch {batch}")
        for col in ("planner", "iteration s", "$/1M tokens", "candidates", "evaluated",
                    "complete", "search s", "best plan"):
            table.add_column(col, justify="left" if col in ("planner", "best plan") else "right")
        times = {}
        for label, (result, wall, planner) in results.items():
            best = result.best
            if best is None:
                table.add_row(label, "-", "-", "-", str(result.evaluated), "-", f"{wall:.1f}",
                              result.no_fit_reason())
                continue
            s = best.summary
            times[label] = s.iteration_time_s
            usd = s.cost_usd / (s.tokens_per_s * s.iteration_time_s) * 1e6
            table.add_row(label, f"{s.iteration_time_s:.4f}", f"{usd:.4f}",
                          str(planner.stats.get("candidates", "-")), str(result.evaluated),
                          str(planner.stats.get("complete", "-")), f"{wall:.1f}", best.note)
        console.print(table)
        if len(times) == len(PLANNERS):
            gains.add_row(model, cluster, f"{times['uniform'] / times['hetero']:.3f}x",
                          f"{times['fasop'] / times['hetero']:.3f}x",
                          f"{times['uniform'] / times['fasop']:.3f}x",
                          f"{times['uniform'] / times['hetero-1f1b']:.3f}x")
    console.print(gains)
    if args.quick:
        return
    workers = min(2, os.cpu_count() or 1)
    t0 = time.perf_counter()
    points = api.pareto("gpt2-xl", ["A100-SXM4-40GB:0..8x8", "A10:0..8x4"], global_batch=64,
                        workers=workers)
    wall = time.perf_counter() - t0
    front = [p for p, on in zip(points, pareto_mask(points)) if on]
    console.print(f"pareto sweep gpt2-xl (A100-SXM4-40GB:0..8x8 x A10:0..8x4): "
                  f"{len(points)} compositions planned in {wall:.1f} s on {workers} workers; "
                  f"{len(front)} on the front: "
                  + ", ".join(f"{p.composition} (${p.usd_per_1m_tokens:.4f}/1M tok, "
                              f"{p.tokens_per_s:,.0f} tok/s)" for p in front))
    found = beats_halves(points)
    if found:
        for mixed, halves in found:
            console.print(f"mixed {mixed.composition}: ${mixed.usd_per_1m_tokens:.4f}/1M tokens,"
                          f" cheaper than " + ", ".join(f"{h.composition} "
                                                        f"${h.usd_per_1m_tokens:.4f}"
                                                        for h in halves))
    else:
        mixed = [p for p in points if p.mixed and p.usd_per_1m_tokens is not None]
        best_mixed = min(mixed, key=lambda p: p.usd_per_1m_tokens or 0.0)
        homo = [p for p in points if not p.mixed and p.usd_per_1m_tokens is not None]
        best_homo = min(homo, key=lambda p: p.usd_per_1m_tokens or 0.0)
        margins = []
        by = {p.composition: p for p in points}
        for p in mixed:
            halves = [by[h] for h in p.composition.split("+") if h in by]
            cheapest = min(h.usd_per_1m_tokens or float("inf") for h in halves)
            margins.append((p.usd_per_1m_tokens / cheapest, p.composition))
        ratio, comp = min(margins)
        console.print(f"no mixed composition is cheaper per token than both of its halves: the "
                      f"cheapest mixed one, {best_mixed.composition}, costs "
                      f"${best_mixed.usd_per_1m_tokens:.4f}/1M tokens against "
                      f"{best_homo.composition}'s ${best_homo.usd_per_1m_tokens:.4f}; the "
                      f"closest to its cheaper half is {comp} at {ratio:.3f}x of it")


if __name__ == "__main__":
    main()
