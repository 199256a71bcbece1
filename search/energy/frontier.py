"""The iteration time–energy frontier by compiled min-cut crashing (Phillips–Dessouky).

Problem (Perseus, Chung et al. SOSP'24 §4): choose one (time, energy) option per instruction of
the pipeline DAG so that, for every iteration time T, the iteration energy

    E(T) = Σ_i E_i + P_block · (N·T − Σ_i t_i) = Σ_i c_i(t_i) + N·P_block·T,
    c_i(t) = E_i(t) − P_block · t            ("effective energy", Perseus §4.1)

is minimal subject to the longest path ≤ T. Like Perseus/Lowtime we quantise time to a unit u
(1 ms; duration q = ⌊t/u⌋ as Lowtime does) and convexify each instruction's options; Lowtime fits
an exponential to them, we use the exact lower convex hull of the (q, c) points, cut at the
cheapest (the slowest *useful* option: anything slower costs more effective energy). With convex
costs the quantised problem is the linear time–cost trade-off problem, and Phillips & Dessouky
(Management Science 23(4), 1977) solve it for every T from the slowest makespan down: each step
finds a minimum s–t cut of the critical subgraph in which crossing an instruction forward costs
its marginal crash cost f = c(q−1) − c(q) and crossing it backward gains its marginal saving
g = c(q) − c(q+1); forward-cut instructions get one unit faster, backward-cut ones one slower,
and the makespan drops by one unit at the least energy increase.

What is ours: (1) the cut with negative backward costs is a plain max flow after substituting
each activity's lower bound by two node arcs (S → out_i and in_i → T of capacity g, activity arc
f − g), so one max flow per step instead of Lowtime's two flows with lower bounds, and it starts
from the previous step's flow whenever the network keeps its arcs (most steps: a step changes
the capacities of a few instructions only), repaired to the new capacities, so only what the
step changed is re-augmented (search/energy/maxflow.py); (2) the whole step — critical
subgraph, network, flow, cut, update — is one numba kernel over flat arrays, with no graph
objects (the kernels are in search/energy/kernels.py); (3) options are
the exact hull points, and every step's plan is re-evaluated exactly in real (unquantised)
time and energy (`InstructionDag.evaluate`), so the frontier we report is what the engine
replays. Steps are yielded one by one (`frontier_steps`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from trainsim.errors import SpecError
from trainsim.search.energy.baselines import all_max, tighten
from trainsim.search.energy.dag import InstructionDag
from trainsim.search.energy.kernels import (
    QEPS,
    evaluate_rows,
    finish_times_kernel,
    pd_run,
    polish_rows,
)
from trainsim.search.energy.point import DEFAULT_UNIT_S, FrontierPoint, make_point, make_points

__all__ = ["DEFAULT_UNIT_S", "BlockHull", "Frontier", "FrontierPoint", "FrontierStep",
           "block_hull", "compute_frontier", "energy_at", "finish_times_kernel",
           "frontier_steps", "make_point", "pareto"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockHull:
    """One (stage, instruction)'s options as a convex cost over integer durations."""

    qmin: int
    """Fastest quantised duration (units)."""
    qmax: int
    """Slowest useful quantised duration (units): the cheapest hull point."""
    cost: np.ndarray
    """Interpolated effective energy (J) at q = qmin..qmax."""
    option: np.ndarray
    """Option index (into the profile's options, fastest first) used at q = qmin..qmax: the
    slowest hull vertex not slower than q."""


def block_hull(time_s: np.ndarray, energy_j: np.ndarray, p_block_w: float,
               unit_s: float, *, min_saving_w: float = 0.0) -> BlockHull:
    """Lower convex hull of an instruction's options in (quantised time, effective energy).

    Options sharing a quantised time keep the fastest (Lowtime keeps the same one: its time is
    closest to the quantised value); the hull is cut at its cheapest point, or earlier where a
    segment saves less than `min_saving_w` joules per second of slowdown.
    """
    q = np.floor(time_s / unit_s + QEPS).astype(np.int64)
    c = energy_j - p_block_w * time_s
    best: dict[int, int] = {}
    for k in np.argsort(time_s, kind="stable"):
        best.setdefault(int(q[k]), int(k))
    qs = sorted(best)
    pts = [(qv, float(c[best[qv]]), best[qv]) for qv in qs]
    hull: list[tuple[int, float, int]] = []
    for pt in pts:  # monotone chain, lower hull, left to right
        while len(hull) >= 2:
            (x1, y1, _), (x2, y2, _) = hull[-2], hull[-1]
            if (x2 - x1) * (pt[1] - y1) - (y2 - y1) * (pt[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(pt)
    cheapest = min(range(len(hull)), key=lambda k: (hull[k][1], hull[k][0]))
    hull = hull[: cheapest + 1]
    for k in range(len(hull) - 1):
        (x1, y1, _), (x2, y2, _) = hull[k], hull[k + 1]
        if (y1 - y2) / ((x2 - x1) * unit_s) < min_saving_w:
            hull = hull[: k + 1]
            break
    qmin, qmax = hull[0][0], hull[-1][0]
    cost = np.empty(qmax - qmin + 1)
    option = np.empty(qmax - qmin + 1, dtype=np.int64)
    for (x1, y1, k1), (x2, y2, _) in itertools.pairwise(hull):
        for x in range(x1, x2):
            cost[x - qmin] = y1 + (y2 - y1) * (x - x1) / (x2 - x1)
            option[x - qmin] = k1
    cost[-1], option[-1] = hull[-1][1], hull[-1][2]
    return BlockHull(qmin=qmin, qmax=qmax, cost=cost, option=option)


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontierStep:
    """What one crashing step yields."""

    iteration: int
    """0 for the all-slowest-useful start, then one per unit of makespan removed."""
    makespan_units: int
    """Quantised makespan the step reached."""
    cost_change_j: float
    """Effective-energy increase of the step (the min-cut value)."""
    point: FrontierPoint
    """The step's plan, evaluated exactly."""
    final_makespan_units: int = 0
    """Quantised makespan of the all-fastest plan, where crashing ends: the search takes about
    `makespan_units − final_makespan_units` more steps (progress bars)."""


def _next_times(time_s: np.ndarray) -> np.ndarray:
    """Per option: the least time of another option of the block that is no faster (inf:
    none), for `polish_rows`."""
    later = time_s[None, :] >= time_s[:, None]
    np.fill_diagonal(later, False)
    return np.where(later, time_s[None, :], np.inf).min(axis=1)


class _Compiled:
    """Flat arrays of a DAG + hulls for the kernel, and exact evaluation of a duration vector."""

    def __init__(self, dag: InstructionDag, unit_s: float, min_saving_w: float = 0.0) -> None:
        self.dag, self.unit_s = dag, unit_s
        p_block = dag.profile.blocking_power_w
        self.hulls = [block_hull(dag.options(b)[1], dag.options(b)[2], p_block, unit_s,
                                 min_saving_w=min_saving_w)
                      for b in range(len(dag.block_keys))]
        self.qmin = np.array([h.qmin for h in self.hulls], dtype=np.int64)
        self.qmax = np.array([h.qmax for h in self.hulls], dtype=np.int64)
        sizes = [len(h.cost) for h in self.hulls]
        self.tab_ptr = np.zeros(len(sizes) + 1, dtype=np.int64)
        self.tab_ptr[1:] = np.cumsum(sizes)
        self.cost_tab = np.concatenate([h.cost for h in self.hulls])
        self.opt_tab = np.concatenate([h.option for h in self.hulls])
        n = dag.num_nodes
        succ: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for k in range(dag.pred_ptr[i], dag.pred_ptr[i + 1]):
                succ[int(dag.pred_idx[k])].append(i)
        self.succ_ptr = np.zeros(n + 1, dtype=np.int64)
        self.succ_ptr[1:] = np.cumsum([len(x) for x in succ])
        self.succ_idx = np.array([j for x in succ for j in x], dtype=np.int64)
        arcs = 2 * (6 * n + len(self.succ_idx) + 2)
        nv = 2 * n + 2
        self.work = (np.zeros(n, np.int64), np.zeros(n, np.int64),
                     np.zeros(nv, np.int64), np.zeros(arcs, np.int64), np.zeros(arcs, np.int64),
                     np.zeros(arcs, np.int64), np.zeros(arcs), np.zeros(nv, np.int64),
                     np.zeros(nv, np.int64), np.zeros(nv, np.int64), np.zeros(nv, np.int64),
                     np.zeros(n, np.int64), np.zeros(n, np.int64),  # arc_s, arc_t
                     np.full(1, -1, np.int64), np.zeros(arcs, np.int64),  # the last network
                     np.zeros(arcs, np.int64), np.zeros(arcs), np.zeros(nv))
        # options of every block, flat (block b's at opt_ptr[b]:opt_ptr[b+1], fastest first)
        self.block = dag.block
        blocks = [dag.options(b) for b in range(len(dag.block_keys))]
        self.opt_ptr = np.zeros(len(blocks) + 1, dtype=np.int64)
        self.opt_ptr[1:] = np.cumsum([len(o[0]) for o in blocks])
        self.opt_freq = np.concatenate([o[0] for o in blocks]).astype(float)
        self.opt_time = np.concatenate([o[1] for o in blocks]).astype(float)
        self.opt_energy = np.concatenate([o[2] for o in blocks]).astype(float)
        self.next_time = np.concatenate([_next_times(o[1].astype(float)) for o in blocks])
        self.time_ord = np.concatenate([self.opt_ptr[b] + np.argsort(o[1], kind="stable")
                                        for b, o in enumerate(blocks)])

    def slowest(self) -> np.ndarray:
        return self.qmax[self.block].copy()

    def fastest_units(self) -> int:
        """Quantised makespan (units) with every instruction at its fastest option."""
        dag = self.dag
        q = self.qmin[self.block].astype(float)
        return round(float(finish_times_kernel(q, dag.pred_ptr, dag.pred_idx).max()))

    def polish(self, points: list[FrontierPoint]) -> list[FrontierPoint]:
        """Each of `points` with every instruction slowed into its real slack (`polish_rows`)."""
        dag = self.dag
        freq, t, e = polish_rows(np.array([p.freq_mhz for p in points], dtype=float),
                                 self.block, self.opt_ptr, self.opt_freq, self.opt_time,
                                 self.opt_energy, self.next_time, self.time_ord,
                                 dag.pred_ptr, dag.pred_idx, self.succ_ptr, self.succ_idx,
                                 dag.profile.blocking_power_w)
        return make_points(dag, freq, t, e, self.unit_s)

    def run(self, d: np.ndarray, max_steps: int, *, warm: bool = True
            ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Up to max_steps crashing steps from d (in place): (rows, cost changes, done).
        `warm=False` computes every step's max flow from zero (the same rows; for tests)."""
        dag = self.dag
        out = np.empty((max_steps, len(d)), dtype=np.int64)
        changes = np.empty(max_steps)
        k, done = pd_run(d, max_steps, warm, out, changes, self.block, self.qmin, self.qmax,
                         self.tab_ptr, self.cost_tab, dag.pred_ptr, dag.pred_idx,
                         self.succ_ptr, self.succ_idx, *self.work)
        return out[:k], changes[:k], bool(done)

    def points(self, rows: np.ndarray) -> list[FrontierPoint]:
        """Exact evaluation of the plans duration rows stand for."""
        dag = self.dag
        r = len(rows)
        times, energies, qtimes, qenergies, mtimes, menergies = (np.empty(r) for _ in range(6))
        opts = np.empty(rows.shape, dtype=np.int64)
        evaluate_rows(rows, self.block, self.tab_ptr, self.qmin, self.opt_tab, self.opt_ptr,
                       self.opt_time, self.opt_energy, dag.pred_ptr, dag.pred_idx,
                       dag.profile.blocking_power_w, dag.num_stages, self.unit_s, times,
                       energies, qtimes, qenergies, opts, self.cost_tab, mtimes, menergies)
        freq = self.opt_freq[self.opt_ptr[self.block][None, :] + opts]
        return [FrontierPoint(time_s=float(times[k]), energy_j=float(energies[k]),
                              freq_mhz=freq[k], quant_time_s=round(qtimes[k] / self.unit_s)
                              * self.unit_s, quant_energy_j=float(qenergies[k]),
                              model_time_s=round(mtimes[k] / self.unit_s) * self.unit_s,
                              model_energy_j=float(menergies[k]))
                for k in range(r)]


def frontier_steps(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S,
                   max_steps: int | None = None, chunk: int = 256,
                   min_saving_w: float = 0.0) -> Iterator[FrontierStep]:
    """Yield the start (all slowest useful) and then one record per crashing step.

    Steps run in compiled chunks of `chunk`; records come out one by one.

    Args:
        dag: The instruction DAG with options.
        unit_s: Time quantum (s); Lowtime's default 1 ms.
        max_steps: Stop after this many steps (None: until the all-fastest makespan).
        chunk: Steps per compiled call.
        min_saving_w: Leave out option segments saving less than this many joules per second
            of slowdown (0: every useful option; P_block: Lowtime's raw-energy Pareto cut).
    """
    if not unit_s > 0:
        raise SpecError(f"unit_s={unit_s!r} must be > 0")
    comp = _Compiled(dag, unit_s, min_saving_w)
    d = comp.slowest()
    final = comp.fastest_units()
    start = comp.points(d[None, :])[0]
    yield FrontierStep(iteration=0, makespan_units=round(start.quant_time_s / unit_s),
                       cost_change_j=0.0, point=start, final_makespan_units=final)
    iteration = 0
    done = False
    while not done and (max_steps is None or iteration < max_steps):
        want = chunk if max_steps is None else min(chunk, max_steps - iteration)
        rows, changes, done = comp.run(d, want)
        for change, point in zip(changes, comp.points(rows)):
            iteration += 1
            yield FrontierStep(iteration=iteration,
                               makespan_units=round(point.quant_time_s / unit_s),
                               cost_change_j=float(change), point=point,
                               final_makespan_units=final)


@dataclass(frozen=True, kw_only=True, slots=True)
class Frontier:
    """The frontier of one DAG: Pareto-optimal plans, slowest first, and the raw steps."""

    points: list[FrontierPoint]
    """Pareto-optimal in real (time, energy), slowest first."""
    steps: list[FrontierPoint]
    """Every step's plan in order (Lowtime-comparable via quant_* fields)."""
    planner_s: float
    """Wall time of the planner (s)."""
    unit_s: float


def pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Points not dominated in (time_s, energy_j), slowest first (ties keep the first)."""
    ordered = sorted(points, key=lambda p: (round(p.time_s, 12), p.energy_j))
    kept: list[FrontierPoint] = []
    best = float("inf")
    for p in ordered:
        if p.energy_j < best - 1e-12:
            kept.append(p)
            best = p.energy_j
    return kept[::-1]


def compute_frontier(dag: InstructionDag, *, unit_s: float = DEFAULT_UNIT_S,
                     polish: bool = True,
                     on_step: Callable[[FrontierStep], None] | None = None) -> Frontier:
    """The frontier: crashing steps, each plan polished into its slack, Pareto-filtered.

    With `polish` (default) the crashing runs on options down to each instruction's raw-energy
    minimum (segments saving at least P_block per second, as Lowtime's Pareto filter keeps) and
    every step's plan is then slowed into its real slack down to the effective-energy minimum
    (`polish_rows`), which reaches the slow, cheap options off the critical path without
    crashing through them one unit at a time. Without it, crashing starts from every
    instruction's effective-energy minimum (exact for the convexified model, slower). The
    all-max plan and the fastest plans tightened to the all-max time are added so that a plan
    with no slowdown always exists. `on_step` sees every crashing step as it is made (a
    progress bar on a long run: the number of steps grows with the micro-batches × 1/unit_s).
    """
    start = time.perf_counter()
    p_block = dag.profile.blocking_power_w
    cut = p_block if polish else 0.0
    steps = []
    for step in frontier_steps(dag, unit_s=unit_s, min_saving_w=cut):
        if on_step is not None:
            on_step(step)
        steps.append(step.point)
    top = all_max(dag, unit_s=unit_s)
    extra = [tighten(dag, p.freq_mhz, top.time_s, unit_s=unit_s) for p in steps
             if p.time_s > top.time_s and p.quant_time_s <= steps[-1].quant_time_s + 2 * unit_s]
    candidates = steps + extra + [top]
    if polish:
        comp = _Compiled(dag, unit_s, cut)
        candidates += comp.polish(candidates)
    points = pareto(candidates)
    return Frontier(points=points, steps=steps, planner_s=time.perf_counter() - start,
                    unit_s=unit_s)


def energy_at(points: list[FrontierPoint], deadline_s: float, p_block_w: float,
              num_stages: int, *, quantised: bool | str = False) -> float:
    """Least energy of a plan finishing by `deadline_s`, waiting the rest at blocking power
    (Perseus §4.3 straggler accounting); inf when none finishes in time.

    `quantised`: False = real time/energy; True = the plans in Lowtime's quantised convention;
    "model" = the crashing model's values (Lowtime's CSV convention).
    """
    best = float("inf")
    for p in points:
        if quantised == "model":
            t, e = p.model_time_s, p.model_energy_j
        elif quantised:
            t, e = p.quant_time_s, p.quant_energy_j
        else:
            t, e = p.time_s, p.energy_j
        if t <= deadline_s + 1e-12:
            best = min(best, e + num_stages * p_block_w * (deadline_s - t))
    return best
