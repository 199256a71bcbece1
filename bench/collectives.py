"""Collectives as measured (issue 13, item 3): the simulator's collective times against Aceso's
measured NCCL collectives, and what the collective model does to `sim accuracy`.

What Aceso measured (../shared/data/aceso/SOURCES.md; SuperScaler branch Aceso,
profiler/comm_profiler): one call of ``torch.distributed.{all_reduce, all_gather,
reduce_scatter, all_to_all}`` timed with ``time.time()`` between two ``cuda.synchronize()``;
``data_size(MB)`` is the tensor each rank passes, in MiB rounded down (taken as the middle of
its bin; all-gather's is one rank's input, so the full tensor is n × that); 1e9 ms rows were not
measured. ``profiled-time-miniset``: 2 and 4 V100 over PCIe Gen3 (priced on
``1x4xV100-PCIe-32GB``). ``profiled-time-eurosys``: a V100-32GB NVLink node (priced on
``1x8xV100-SXM2-32GB``: 2 GPUs = the NV2 pair 0-3, as the p2p plateau of 42.5 GB/s says; 4 =
GPUs 0-3; 8 = all).

Three predictions per row:

- ``before``: link-peak α-β with rings in rank order (the simulator before this model);
- ``peak``: link-peak α-β with NCCL's NVLink-neighbour rings (simulator/rings.py);
- ``after``: the measured model (hwmodels/collectives.py) plus the harness's host overhead
  (collectives.json ``harness_overheads.aceso_comm_profiler``: the simulator never adds it).

``--fit`` refits the fitted figures of collectives.json (nvlink and pcie efficiencies per kind,
and the harness overhead) by linear least squares on relative error and prints them; it does
not write the file. ``--accuracy`` runs `sim accuracy`'s evaluation three times, each in its own
process (before / peak / after pricing), and prints MAPE and mean signed error per source.

``--speed`` times ``lower()`` (where collectives are planned and priced) with link-peak and
measured pricing, alternating in one process.

Usage: ``python bench/collectives.py [--fit] [--speed] [--accuracy]``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from trainsim.commands.output import print_table
from trainsim.hwmodels.cluster import parse_cluster_spec
from trainsim.hwmodels.collectives import CollectiveModels, collective_models
from trainsim.simulator import collectives as sim_collectives
from trainsim.simulator.collectives import (
    CommPhase,
    collective_time_s,
    link_bandwidths,
    plan_collective,
)
from trainsim.workloads.lowering import comm, lower
from trainsim.workloads.lowering.comm import MemoTopology, alone_time_s, measured_phases
from trainsim.workloads.plan import ParallelPlan
from trainsim.workloads.zoo import get_model

MIB = 1 << 20
HARNESS = "aceso_comm_profiler"
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
BANDS = ((0, 16, "1-15 MiB"), (16, 256, "16-255 MiB"), (256, 1 << 30, ">= 256 MiB"))
_NAME = re.compile(r"prim_(.+)_(all_gather|all_reduce|reduce_scatter|all_to_all)_(\d+)gpus\.csv")


@dataclass(frozen=True, slots=True)
class Setup:
    """One Aceso folder and the cluster and groups its rows are priced on."""

    folder: str
    link_class: str
    spec: str
    groups: dict[int, tuple[int, ...]]


SETUPS = (
    Setup("profiled-time-miniset", "pcie", "1x4xV100-PCIe-32GB", {2: (0, 1), 4: (0, 1, 2, 3)}),
    Setup("profiled-time-eurosys", "nvlink", "1x8xV100-SXM2-32GB",
          {2: (0, 3), 4: (0, 1, 2, 3), 8: tuple(range(8))}),
)


@dataclass(frozen=True, slots=True)
class Row:
    """One measured collective."""

    setup: Setup
    kind: str
    n: int
    label_mib: int
    seconds: float

    @property
    def size_bytes(self) -> float:
        """S as the planner takes it: the full tensor (all-gather: n × one rank's input)."""
        per_rank = (self.label_mib + 0.5) * MIB
        return per_rank * self.n if self.kind == "all_gather" else per_rank


def shared_aceso() -> Path:
    """../shared/data/aceso beside the repository, or $TRAINSIM_SHARED_DATA/aceso."""
    root = os.environ.get("TRAINSIM_SHARED_DATA")
    base = Path(root) if root else Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return base / "aceso"


def aceso_rows(aceso: Path, setups: Sequence[Setup] = SETUPS) -> list[Row]:
    """Every measured row of the prim_*.csv files of `setups`' folders."""
    rows = []
    for setup in setups:
        for path in sorted((aceso / setup.folder).glob("prim_*.csv")):
            m = _NAME.fullmatch(path.name)
            if not m or int(m.group(3)) not in setup.groups:
                continue
            with path.open() as fh:
                reader = csv.reader(fh)
                next(reader)
                rows += [Row(setup, m.group(2), int(m.group(3)), int(mb), float(ms) * 1e-3)
                         for mb, ms in reader if float(ms) < 1e5]  # 1e9: not measured
    return rows


@contextlib.contextmanager
def rank_order_rings() -> Iterator[None]:
    """Rings in rank order (one per collective), as the planner built them before."""
    saved = sim_collectives.node_rings, sim_collectives.node_path
    sim_collectives.node_rings = lambda members, hop: [(tuple(members), 1.0)]
    sim_collectives.node_path = lambda members, hop, rings=None: list(members)
    try:
        yield
    finally:
        sim_collectives.node_rings, sim_collectives.node_path = saved


def peak_time_s(row: Row, topo: MemoTopology) -> float:
    """Link-peak α-β time of `row` alone."""
    group = row.setup.groups[row.n]
    phases = plan_collective(row.kind, group, row.size_bytes, topo)
    return collective_time_s(phases, link_bandwidths(topo, group))


def measured_time_s(row: Row, topo: MemoTopology, models: CollectiveModels) -> float:
    """The measured model's time of `row` alone plus the harness overhead."""
    group = row.setup.groups[row.n]
    phases = measured_phases(plan_collective(row.kind, group, row.size_bytes, topo), topo, models)
    return alone_time_s(phases, topo) + models.harness_overheads[f"{HARNESS}.{row.kind}"]


def predictions(rows: Sequence[Row], models: CollectiveModels) -> dict[str, list[float]]:
    """before / peak / after time of every row."""
    topos = {s.spec: MemoTopology(parse_cluster_spec(s.spec)) for s in SETUPS}
    with rank_order_rings():
        before = [peak_time_s(r, MemoTopology(topos[r.setup.spec].cluster)) for r in rows]
    peak = [peak_time_s(r, topos[r.setup.spec]) for r in rows]
    after = [measured_time_s(r, topos[r.setup.spec], models) for r in rows]
    return {"before": before, "peak": peak, "after": after}


def _mape(pred: Sequence[float], rows: Sequence[Row]) -> tuple[float, float]:
    err = [p / r.seconds - 1 for p, r in zip(pred, rows, strict=True)]
    return sum(abs(e) for e in err) / len(err), sum(err) / len(err)


def print_aceso(rows: Sequence[Row], pred: dict[str, list[float]]) -> None:
    """MAPE per link class × size band, per link class × kind × n, and overall."""
    def table(title: str, key: Callable[[Row], tuple[str, ...]], head: list[str]) -> None:
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(key(r), []).append(i)
        out = []
        for k in sorted(groups):
            idx = groups[k]
            sub = [rows[i] for i in idx]
            cells = [f"{100 * v:.1f}%" for name in ("before", "peak", "after")
                     for v in _mape([pred[name][i] for i in idx], sub)[:1]]
            signed = _mape([pred["after"][i] for i in idx], sub)[1]
            out.append([*k, str(len(idx)), *cells, f"{100 * signed:+.1f}%"])
        print_table(title, [*head, "rows", "MAPE before", "MAPE peak rings", "MAPE after",
                            "after mean signed"], out,
                    right=("rows", "MAPE before", "MAPE peak rings", "MAPE after",
                           "after mean signed"))

    def band(r: Row) -> str:
        return next(name for lo, hi, name in BANDS if lo <= r.label_mib < hi)

    table("Aceso collectives by link class and size band", lambda r: (r.setup.link_class,
                                                                        band(r)),
          ["link class", "size (per rank)"])
    table("Aceso collectives by link class, kind and group size",
          lambda r: (r.setup.link_class, r.kind, str(r.n)), ["link class", "kind", "GPUs"])
    table("Aceso collectives overall", lambda r: (r.setup.link_class,), ["link class"])


def phase_class(row: Row, topo: MemoTopology, models: CollectiveModels) -> str:
    """Link class the measured model prices `row` with: that of its slowest link."""
    group = row.setup.groups[row.n]
    phases = plan_collective(row.kind, group, row.size_bytes, topo)
    slowest = comm._slowest([topo.link(lid) for ph in phases for lid in ph.links])
    return comm._class_of(slowest, topo, group[0], models)


def fit(rows: Sequence[Row], models: CollectiveModels) -> dict[str, Any]:
    """Least squares on relative error of t = h_kind + L + W / e (linear in h per kind and 1/e
    per (class, kind)): L and W come from pricing every row with efficiency 1 (at Aceso's
    ≥ 1 MiB sizes the Simple protocol is chosen, so L does not depend on e). Rows the model
    prices with another class than their setup's are left out of the fit (DGX-1's 8-GPU
    all-to-all, whose pairs without NVLink cross PCIe: a mix of both, not a PCIe measurement).
    Returns the fitted figures."""
    ones = {k: 1.0 for k in (*KINDS, "p2p")}
    unit = replace(models, classes=MappingProxyType({
        name: replace(cls, efficiency=MappingProxyType(ones))
        for name, cls in models.classes.items()}))
    topos = {s.spec: MemoTopology(parse_cluster_spec(s.spec)) for s in SETUPS}
    rows = [r for r in rows if phase_class(r, topos[r.setup.spec], models) == r.setup.link_class]
    classes = [r.setup.link_class for r in rows]
    keys = sorted(set(zip(classes, (r.kind for r in rows), strict=True)))
    a = np.zeros((len(rows), len(KINDS) + len(keys)))
    b = np.ones(len(rows))
    for i, (r, cls) in enumerate(zip(rows, classes, strict=True)):
        topo = topos[r.setup.spec]
        group = r.setup.groups[r.n]
        priced = measured_phases(plan_collective(r.kind, group, r.size_bytes, topo), topo, unit)
        latency = sum(p.latency_s for p in priced)
        wire = alone_time_s(priced, topo) - latency
        a[i, KINDS.index(r.kind)] = 1.0 / r.seconds
        a[i, len(KINDS) + keys.index((cls, r.kind))] = wire / r.seconds
        b[i] = 1.0 - latency / r.seconds
    x, *_ = np.linalg.lstsq(a, b, rcond=None)
    return {**{f"{HARNESS}.{k}": float(v) for k, v in zip(KINDS, x, strict=False)},
            **{f"{c}.{k}": float(1.0 / v)
               for (c, k), v in zip(keys, x[len(KINDS):], strict=True)}}


_VARIANT_CODE = """
import json, sys
from trainsim import api
from trainsim.simulator.collectives import plan_collective
from trainsim.workloads.lowering import comm
sys.path.insert(0, {bench!r})
import collectives as bench
variant = {variant!r}
if variant in ("before", "peak"):
    comm.plan_measured = lambda k, g, s, t, a="auto": plan_collective(k, g, s, t, a)
ctx = bench.rank_order_rings() if variant == "before" else bench.contextlib.nullcontext()
with ctx:
    report = api.accuracy(None)
print(json.dumps([[r.run.source, r.run.ref_kind, r.error, r.run.text("name")]
                  for r in report.results]))
"""


def accuracy_by_source() -> None:
    """`sim accuracy`'s throughput errors with each pricing, each in a fresh process."""
    results: dict[str, list[list[Any]]] = {}
    for variant in ("before", "peak", "after"):
        code = _VARIANT_CODE.format(bench=str(Path(__file__).resolve().parent), variant=variant)
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    sources = sorted({row[0] for row in results["after"] if row[1] == "tokens_per_s_per_gpu"})
    table = []
    for source in [*sources, "all"]:
        cells = []
        for variant in ("before", "peak", "after"):
            err = [e for s, k, e, _ in results[variant]
                   if k == "tokens_per_s_per_gpu" and source in (s, "all")]
            cells += [f"{100 * sum(abs(e) for e in err) / len(err):.1f}%",
                      f"{100 * sum(err) / len(err):+.1f}%"]
        table.append([source, str(len(err)), *cells])
    keyed = {v: {(row[0], row[3]): row[2] for row in results[v]
                 if row[1] == "tokens_per_s_per_gpu"} for v in results}
    moved = [[s, name, *(f"{100 * keyed[v][(s, name)]:+.1f}%" if (s, name) in keyed[v]
                         else "-" for v in ("before", "peak", "after"))]
             for s, name in sorted(set().union(*keyed.values()))]
    print_table("sim accuracy per row (tokens/s per GPU, signed error)",
                ["source", "run", "before", "peak rings", "after"], moved,
                right=("before", "peak rings", "after"))
    heads = [f"{v} {m}" for v in ("before", "peak", "after") for m in ("MAPE", "signed")]
    print_table("sim accuracy, tokens/s per GPU: collective pricing before / peak rings / after",
                ["source", "rows", *heads], table, right=("rows", *heads))


SPEED_CASES = (
    ("quickstart default", "gpt3-1.3b", "4xV100-SXM2-32GB", {"pp": 4, "global_batch": 512}),
    ("gpt3-175b 1024 GPUs", "gpt3-175b", "128x8xA100-SXM4-80GB",
     {"dp": 8, "tp": 8, "pp": 16, "global_batch": 1536, "micro_batch_size": 1}),
)


def lowering_speed(repeats: int = 3) -> None:
    """Wall time of `lower()` (where collectives are planned and priced) with link-peak pricing
    and with the measured model, alternating in this one process, best of `repeats`."""
    def peak(kind: str, group: tuple[int, ...], size: float, topo: MemoTopology,
             algorithm: str = "auto") -> list[CommPhase]:
        return plan_collective(kind, group, size, topo, algorithm)

    measured = comm.plan_measured
    rows = []
    for label, model, spec, fields in SPEED_CASES:
        hw, net = parse_cluster_spec(spec), get_model(model)
        plan = ParallelPlan.build(net, hw, **fields)
        best = {"before": float("inf"), "peak": float("inf"), "measured": float("inf")}
        for _ in range(repeats):
            for name, pricing in (("before", peak), ("peak", peak), ("measured", measured)):
                comm.plan_measured = pricing
                rings = rank_order_rings() if name == "before" else contextlib.nullcontext()
                with rings:
                    start = time.perf_counter()
                    lower(net, hw, plan)
                    best[name] = min(best[name], time.perf_counter() - start)
        comm.plan_measured = measured
        rows.append([label, *(f"{best[k]:.3f}" for k in ("before", "peak", "measured")),
                     f"{best['measured'] / best['before']:.2f}"])
    heads = ["before (rank-order rings, link peak)", "NCCL rings, link peak", "measured model",
             "measured / before"]
    print_table("lower() wall time, s (best of 3, alternating in one process)",
                ["case", *heads], rows, right=heads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit and print the fitted figures")
    ap.add_argument("--speed", action="store_true",
                    help="also time lower() with link-peak and measured pricing")
    ap.add_argument("--accuracy", action="store_true",
                    help="also compare sim accuracy's errors per source (three evaluations)")
    args = ap.parse_args(argv)
    if not sys.stdout.isatty():
        os.environ.setdefault("COLUMNS", "200")
    aceso = shared_aceso()
    if not aceso.is_dir():
        print(f"{aceso}: not found (the Aceso reference data is needed)")
        return 2
    rows = aceso_rows(aceso)
    models = collective_models()
    if args.fit:
        for key, value in fit(rows, models).items():
            print(f"{key}: {value:.4g}")
    print_aceso(rows, predictions(rows, models))
    if args.speed:
        lowering_speed()
    if args.accuracy:
        accuracy_by_source()
    return 0


if __name__ == "__main__":
    sys.exit(main())
