"""Cluster compositions swept for `sim pareto`: each planned with the `hetero` planner.

A composition range reads ``GPU:LO..HIxG`` -- LO to HI nodes of G GPUs of type GPU (``A10:0..8x4``
is 0 to 8 nodes of 4 A10s). The sweep takes every combination of the ranges but the empty one,
plans each on the Oracle (worker processes, one composition each) and returns one
`ParetoPoint` per composition, in a fixed order, whatever order the workers finish in.

Per composition the planner runs with a smaller space than `sim search --method hetero`
(`SWEEP_PLANNER`: no recompute, fewer node orders and evaluations), so 81 compositions take
about a minute on two cores; the point records whether its search was exhaustive.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainsim.errors import SpecError, TrainsimError
from trainsim.hwmodels.cluster import parse_cluster
from trainsim.hwmodels.gpus import get_gpu
from trainsim.search.hetero.objectives import with_prices
from trainsim.search.hetero.pareto import ParetoPoint
from trainsim.search.hetero.planner import HeteroPlanner
from trainsim.search.oracle import Oracle
from trainsim.search.planner import SearchSpec, run_search
from trainsim.search.sweep.executors import LocalExecutor
from trainsim.workloads.model import ModelSpec

_RANGE = re.compile(r"^(?P<gpu>[^:]+):(?P<lo>\d+)(?:\.\.(?P<hi>\d+))?x(?P<per>\d+)$")

SWEEP_PLANNER: dict[str, Any] = {"recompute": ("none",), "order_limit": 8, "max_evals": 24,
                                 "refine_rounds": 1}
"""HeteroPlanner settings per composition (see the module docstring)."""

MAX_COMPOSITIONS = 10_000
"""Sweeps larger than this are refused before any work starts."""


@dataclass(frozen=True, slots=True)
class GpuRange:
    """LO..HI nodes of `per_node` GPUs of one type."""

    gpu: str
    low: int
    high: int
    per_node: int


def parse_range(text: str) -> GpuRange:
    """``A100-SXM4-40GB:0..8x8`` -> GpuRange; one clear line when it is not one."""
    m = _RANGE.match(text.strip())
    if m is None:
        raise SpecError(f"--gpus {text!r} must read GPU:LO..HIxG (LO to HI nodes of G GPUs), "
                        f"e.g. A10:0..8x4")
    gpu = get_gpu(m["gpu"]).name  # unknown GPUs get the catalog's error with suggestions
    lo, hi = int(m["lo"]), int(m["hi"] if m["hi"] is not None else m["lo"])
    per = int(m["per"])
    if hi < lo:
        raise SpecError(f"--gpus {text!r}: the range {lo}..{hi} is empty (LO must be <= HI)")
    if per < 1 or hi > 4096:
        raise SpecError(f"--gpus {text!r}: need >= 1 GPU per node and at most 4096 nodes")
    return GpuRange(gpu=gpu, low=lo, high=hi, per_node=per)


def compositions(ranges: Sequence[GpuRange]) -> list[str]:
    """Cluster specs of every combination of the ranges but the empty one."""
    if not ranges:
        raise SpecError("--gpus: give at least one range, e.g. --gpus A10:0..8x4")
    if len({r.gpu for r in ranges}) != len(ranges):
        raise SpecError("--gpus names a GPU type twice; give one range per type")
    total = math.prod(r.high - r.low + 1 for r in ranges)
    if total > MAX_COMPOSITIONS:
        raise SpecError(f"--gpus spans {total:,} compositions; at most {MAX_COMPOSITIONS:,} "
                        f"(narrow the ranges)")
    out = []
    for counts in itertools.product(*(range(r.low, r.high + 1) for r in ranges)):
        parts = [f"{n}x{r.per_node}x{r.gpu}" for n, r in zip(counts, ranges) if n]
        if parts:
            out.append("+".join(parts))
    if not out:
        raise SpecError("--gpus: every range is 0..0, so there is no cluster to plan")
    return out


def plan_composition(model: ModelSpec, spec: str, global_batch: int,
                     prices: Mapping[str, float], planner: Mapping[str, Any],
                     time_budget_s: float) -> ParetoPoint:
    """Plan one composition and price its best plan (a point with `error` when none fits)."""
    cluster = parse_cluster(spec)
    here = {g.gpu.name for g in cluster.node_groups}
    cluster = with_prices(cluster, {k: v for k, v in prices.items() if k in here})
    gpus: dict[str, int] = {}
    for g in cluster.node_groups:
        gpus[g.gpu.name] = gpus.get(g.gpu.name, 0) + g.num_gpus
    base: dict[str, Any] = {"composition": spec, "gpus": tuple(gpus.items()),
                            "mixed": len(gpus) > 1, "usd_per_hour": cluster.price_per_hour_usd}
    try:
        planner_obj = HeteroPlanner(name="hetero", **planner)
        request = SearchSpec(model=model, cluster=cluster, global_batch=global_batch,
                             time_budget_s=time_budget_s)
        result = run_search(planner_obj, request, oracle=Oracle(model, cluster))
    except TrainsimError as exc:
        return ParetoPoint(**base, tokens_per_s=None, iteration_time_s=None,
                           usd_per_1m_tokens=None, plan="", error=str(exc))
    best = result.best
    if best is None:
        return ParetoPoint(**base, tokens_per_s=None, iteration_time_s=None,
                           usd_per_1m_tokens=None, plan="", error=result.no_fit_reason())
    tps = best.summary.tokens_per_s
    usd = cluster.price_per_hour_usd / 3600 / tps * 1e6 if tps > 0 else None
    exhaustive = "" if planner_obj.stats.get("complete") else " (search capped)"
    return ParetoPoint(**base, tokens_per_s=tps, iteration_time_s=best.summary.iteration_time_s,
                       usd_per_1m_tokens=usd,
                       plan=best.note.removeprefix("hetero ") + exhaustive)


def _job(args: tuple[ModelSpec, str, int, dict[str, float], dict[str, Any], float]
         ) -> ParetoPoint:
    return plan_composition(*args)


def sweep(model: ModelSpec, specs: Sequence[str], global_batch: int, *,
          prices: Mapping[str, float] | None = None, workers: int = 2,
          planner: Mapping[str, Any] | None = None, time_budget_s: float = 30.0,
          on_done: Callable[[ParetoPoint], None] | None = None) -> list[ParetoPoint]:
    """Plan every composition in `specs` (worker processes when workers > 1: the sweep's
    LocalExecutor), returned in the order of `specs`."""
    settings = dict(SWEEP_PLANNER if planner is None else planner)
    jobs = [(model, s, global_batch, dict(prices or {}), settings, time_budget_s)
            for s in specs]
    results: dict[str, ParetoPoint] = {}
    for point in LocalExecutor(workers).run(_job, jobs):  # finishing in any order
        results[point.composition] = point
        if on_done is not None:
            on_done(point)
    return [results[s] for s in specs]


def beats_halves(points: Sequence[ParetoPoint]) -> list[tuple[ParetoPoint, list[ParetoPoint]]]:
    """Mixed compositions cheaper per token than each of their homogeneous parts (the same
    nodes of one GPU type alone), with those parts."""
    by_spec = {p.composition: p for p in points}
    out = []
    for p in points:
        if not p.mixed or p.usd_per_1m_tokens is None:
            continue
        halves = [by_spec.get(part) for part in p.composition.split("+")]
        if any(h is None or h.usd_per_1m_tokens is None for h in halves):
            continue
        found = [h for h in halves if h is not None]
        if all(p.usd_per_1m_tokens < (h.usd_per_1m_tokens or math.inf) for h in found):
            out.append((p, found))
    return out


__all__ = [
    "SWEEP_PLANNER",
    "GpuRange",
    "beats_halves",
    "compositions",
    "parse_range",
    "plan_composition",
    "sweep",
]
