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
f − g), so one Dinic max flow per step instead of Lowtime's two flows with lower bounds; (2) the
whole step — critical subgraph, network, Dinic, cut, update — is one numba kernel over flat
arrays, with no graph objects; (3) options are the exact hull points, and every step's plan is
re-evaluated exactly in real (unquantised) time and energy (`InstructionDag.evaluate`), so the
frontier we report is what the engine replays. Steps are yielded one by one (`frontier_steps`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from numba import njit

from trainsim.errors import SpecError
from trainsim.search.energy_dag import InstructionDag

#: Lowtime's (and Perseus's) time quantum: 1 ms.
DEFAULT_UNIT_S: float = 1e-3

_INF = 1e30
_EPS = 1e-9
#: Guard of ⌊t/u⌋ against binary rounding (0.003 / 0.001 = 2.9999999999999996).
_QEPS = 1e-9


@njit(cache=True)
def finish_times_kernel(durations, pred_ptr, pred_idx):
    """Earliest finish of every node of a topologically ordered DAG."""
    n = len(durations)
    out = np.zeros(n)
    for i in range(n):
        start = 0.0
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            start = max(start, out[pred_idx[k]])
        out[i] = start + durations[i]
    return out


@njit(cache=True)
def _add_arc(u, v, cap, first, nxt, to, frm, res, m):
    to[m] = v
    frm[m] = u
    res[m] = cap
    nxt[m] = first[u]
    first[u] = m
    to[m + 1] = u
    frm[m + 1] = v
    res[m + 1] = 0.0
    nxt[m + 1] = first[v]
    first[v] = m + 1
    return m + 2


@njit(cache=True)
def _dinic(nv, s, t, first, nxt, to, frm, res, level, it, queue, path):
    """Max flow s→t on the residual arrays (modified in place); stops early past _INF/2."""
    flow = 0.0
    while True:
        for v in range(nv):
            level[v] = -1
        level[s] = 0
        qh, qt = 0, 1
        queue[0] = s
        while qh < qt:
            u = queue[qh]
            qh += 1
            e = first[u]
            while e != -1:
                if res[e] > _EPS and level[to[e]] < 0:
                    level[to[e]] = level[u] + 1
                    queue[qt] = to[e]
                    qt += 1
                e = nxt[e]
        if level[t] < 0:
            return flow
        for v in range(nv):
            it[v] = first[v]
        u = s
        top = 0
        while True:
            if u == t:
                push = _INF * 10.0
                for k in range(top):
                    push = min(push, res[path[k]])
                for k in range(top):
                    res[path[k]] -= push
                    res[path[k] ^ 1] += push
                flow += push
                if flow >= _INF / 2:
                    return flow
                # retreat to the tail of the first saturated arc of the path
                cut = 0
                while cut < top - 1 and res[path[cut]] > _EPS:
                    cut += 1
                top = cut
                u = frm[path[cut]]
                continue
            e = it[u]
            while e != -1 and not (res[e] > _EPS and level[to[e]] == level[u] + 1):
                e = nxt[e]
            it[u] = e
            if e != -1:
                path[top] = e
                top += 1
                u = to[e]
            else:
                if u == s:
                    break
                level[u] = -1
                top -= 1
                u = frm[path[top]]
                it[u] = nxt[it[u]]


@njit(cache=True)
def _pd_step(d, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx, succ_ptr, succ_idx,
             es, ls, first, nxt, to, frm, res, level, it, queue, path):
    """One Phillips–Dessouky step on integer durations `d` (in place).

    Returns (status, cost_change): status 0 = makespan reduced by one unit, 1 = no finite cut
    (the all-fastest makespan is reached).
    """
    n = len(d)
    makespan = 0
    for i in range(n):
        st = 0
        for k in range(pred_ptr[i], pred_ptr[i + 1]):
            p = pred_idx[k]
            st = max(st, es[p] + d[p])
        es[i] = st
        makespan = max(makespan, st + d[i])
    for i in range(n - 1, -1, -1):
        lf = makespan
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            lf = min(lf, ls[succ_idx[k]])
        ls[i] = lf - d[i]
    nv = 2 * n + 2
    s_node, t_node = 2 * n, 2 * n + 1
    for v in range(nv):
        first[v] = -1
    m = 0
    g_sum = 0.0
    for i in range(n):
        if es[i] != ls[i]:
            continue
        b = blk[i]
        base = tab_ptr[b] - qmin[b]
        c_here = cost_tab[base + d[i]]
        f = _INF if d[i] <= qmin[b] else cost_tab[base + d[i] - 1] - c_here
        g = 0.0 if d[i] >= qmax[b] else c_here - cost_tab[base + d[i] + 1]
        g = max(g, 0.0)
        cap = _INF if f >= _INF else max(f - g, 0.0)
        m = _add_arc(2 * i, 2 * i + 1, cap, first, nxt, to, frm, res, m)
        if d[i] >= qmax[b]:
            m = _add_arc(2 * i + 1, 2 * i, _INF, first, nxt, to, frm, res, m)
        if g > 0.0:
            m = _add_arc(2 * i, t_node, g, first, nxt, to, frm, res, m)
            m = _add_arc(s_node, 2 * i + 1, g, first, nxt, to, frm, res, m)
            g_sum += g
        if pred_ptr[i] == pred_ptr[i + 1]:
            m = _add_arc(s_node, 2 * i, _INF, first, nxt, to, frm, res, m)
        if succ_ptr[i] == succ_ptr[i + 1] and es[i] + d[i] == makespan:
            m = _add_arc(2 * i + 1, t_node, _INF, first, nxt, to, frm, res, m)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            if es[j] == ls[j] and es[i] + d[i] == es[j]:
                m = _add_arc(2 * i + 1, 2 * j, _INF, first, nxt, to, frm, res, m)
    flow = _dinic(nv, s_node, t_node, first, nxt, to, frm, res, level, it, queue, path)
    if flow >= _INF / 2:
        return 1, 0.0
    # Source side of the minimal min cut: reachable from S in the residual network.
    for v in range(nv):
        level[v] = 0
    level[s_node] = 1
    qh, qt = 0, 1
    queue[0] = s_node
    while qh < qt:
        u = queue[qh]
        qh += 1
        e = first[u]
        while e != -1:
            if res[e] > _EPS and level[to[e]] == 0:
                level[to[e]] = 1
                queue[qt] = to[e]
                qt += 1
            e = nxt[e]
    moved = 0
    for i in range(n):
        if es[i] != ls[i]:
            continue
        a, z = level[2 * i], level[2 * i + 1]
        if a == 1 and z == 0:
            d[i] -= 1
            moved += 1
        elif a == 0 and z == 1:
            d[i] += 1
    if moved == 0:
        return 1, 0.0
    return 0, flow - g_sum


@njit(cache=True)
def _pd_run(d, max_steps, out, changes, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx,
            succ_ptr, succ_idx, es, ls, first, nxt, to, frm, res, level, it, queue,
            path):
    """Up to `max_steps` steps; row k of `out` gets the durations after step k. Returns the
    number of steps done and whether the fastest makespan was reached."""
    for k in range(max_steps):
        status, change = _pd_step(d, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx,
                                  succ_ptr, succ_idx, es, ls, first, nxt, to, frm, res, level,
                                  it, queue, path)
        if status != 0:
            return k, True
        out[k, :] = d
        changes[k] = change
    return max_steps, False


@njit(cache=True)
def _evaluate_rows(rows, blk, tab_ptr, qmin, opt_tab, opt_ptr, opt_time, opt_energy,
                   pred_ptr, pred_idx, p_block, num_stages, unit_s, times, energies, qtimes,
                   qenergies, opts, cost_tab, mtimes, menergies):
    """Exact and Lowtime-convention time/energy of each row of durations (and its options)."""
    dq = np.empty(rows.shape[1])
    n = rows.shape[1]
    t = np.empty(n)
    qt = np.empty(n)
    for r in range(rows.shape[0]):
        e_sum = 0.0
        t_sum = 0.0
        qt_sum = 0.0
        c_sum = 0.0
        for i in range(n):
            b = blk[i]
            dq[i] = rows[r, i]
            c_sum += cost_tab[tab_ptr[b] + rows[r, i] - qmin[b]]
            o = opt_tab[tab_ptr[b] + rows[r, i] - qmin[b]]
            opts[r, i] = o
            t[i] = opt_time[opt_ptr[b] + o]
            qt[i] = np.floor(t[i] / unit_s + _QEPS) * unit_s
            e_sum += opt_energy[opt_ptr[b] + o]
            t_sum += t[i]
            qt_sum += qt[i]
        ms = finish_times_kernel(t, pred_ptr, pred_idx).max()
        qms = finish_times_kernel(qt, pred_ptr, pred_idx).max()
        times[r] = ms
        energies[r] = e_sum + p_block * (num_stages * ms - t_sum)
        qtimes[r] = qms
        qenergies[r] = e_sum - p_block * qt_sum + num_stages * p_block * qms
        mms = finish_times_kernel(dq, pred_ptr, pred_idx).max() * unit_s
        mtimes[r] = mms
        menergies[r] = c_sum + num_stages * p_block * mms


@njit(cache=True)
def _polish_kernel(freq, blk, opt_ptr, opt_freq, opt_time, opt_energy, pred_ptr, pred_idx,
                   succ_ptr, succ_idx, p_block):
    """Slow every instruction into its slack without lengthening the iteration.

    Reverse topological sweep: node i may take any option no faster than its current one that
    fits between its earliest start (predecessors at their current speeds) and the latest start
    of its successors (already placed as late as possible); it takes the one of least effective
    energy E − P_block·t. Predecessors keep room for their current speed, so the makespan does
    not grow and the plan's energy does not rise.
    """
    n = len(freq)
    cur = np.empty(n, np.int64)
    t = np.empty(n)
    for i in range(n):
        b = blk[i]
        cur[i] = opt_ptr[b]
        for k in range(opt_ptr[b], opt_ptr[b + 1]):
            if opt_freq[k] == freq[i]:
                cur[i] = k
        t[i] = opt_time[cur[i]]
    ef = finish_times_kernel(t, pred_ptr, pred_idx)
    makespan = ef.max()
    ls = np.empty(n)
    out = np.empty(n)
    for i in range(n - 1, -1, -1):
        lf = makespan
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            lf = min(lf, ls[succ_idx[k]])
        window = lf - (ef[i] - t[i])
        best = cur[i]
        best_c = opt_energy[best] - p_block * opt_time[best]
        b = blk[i]
        for k in range(opt_ptr[b], opt_ptr[b + 1]):
            if opt_time[k] >= t[i] and opt_time[k] <= window:
                c = opt_energy[k] - p_block * opt_time[k]
                if c < best_c - 1e-12:
                    best, best_c = k, c
        ls[i] = lf - opt_time[best]
        out[i] = opt_freq[best]
    return out


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
    q = np.floor(time_s / unit_s + _QEPS).astype(np.int64)
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
class FrontierPoint:
    """One frequency plan on (or produced on the way to) the frontier."""

    time_s: float
    """Iteration time of the plan, real (unquantised) durations."""
    energy_j: float
    """Iteration energy, real: Σ E_i + P_block · (N·T − Σ t_i)."""
    freq_mhz: np.ndarray
    """Per DAG node: SM clock (MHz)."""
    quant_time_s: float
    """Lowtime's convention: longest path of ⌊t_i/u⌋·u."""
    quant_energy_j: float
    """Lowtime's convention: Σ (E_i − P_block·⌊t_i/u⌋·u) + N·P_block·quant_time_s."""
    model_time_s: float = float("nan")
    """The crashing model's makespan (quantised durations before rounding to options)."""
    model_energy_j: float = float("nan")
    """The crashing model's energy: Σ hull cost at the durations + N·P_block·model_time_s —
    what Lowtime reports as its frontier (with its exponential fit in place of our hull)."""


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
                     np.zeros(nv, np.int64), np.zeros(nv, np.int64), np.zeros(nv, np.int64))
        # options of every block, flat (block b's at opt_ptr[b]:opt_ptr[b+1], fastest first)
        self.block = dag.block
        blocks = [dag.options(b) for b in range(len(dag.block_keys))]
        self.opt_ptr = np.zeros(len(blocks) + 1, dtype=np.int64)
        self.opt_ptr[1:] = np.cumsum([len(o[0]) for o in blocks])
        self.opt_freq = np.concatenate([o[0] for o in blocks]).astype(float)
        self.opt_time = np.concatenate([o[1] for o in blocks]).astype(float)
        self.opt_energy = np.concatenate([o[2] for o in blocks]).astype(float)

    def slowest(self) -> np.ndarray:
        return self.qmax[self.block].copy()

    def fastest_units(self) -> int:
        """Quantised makespan (units) with every instruction at its fastest option."""
        dag = self.dag
        q = self.qmin[self.block].astype(float)
        return round(float(finish_times_kernel(q, dag.pred_ptr, dag.pred_idx).max()))

    def polish(self, point: FrontierPoint) -> FrontierPoint:
        """`point` with every instruction slowed into its real slack (`_polish_kernel`)."""
        dag = self.dag
        freq = _polish_kernel(point.freq_mhz, self.block, self.opt_ptr, self.opt_freq,
                              self.opt_time, self.opt_energy, dag.pred_ptr, dag.pred_idx,
                              self.succ_ptr, self.succ_idx, dag.profile.blocking_power_w)
        t, e = _lookup(freq, self.block, self.opt_ptr, self.opt_freq, self.opt_time,
                       self.opt_energy)
        return make_point(dag, freq, t, e, self.unit_s)

    def run(self, d: np.ndarray, max_steps: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Up to max_steps crashing steps from d (in place): (rows, cost changes, done)."""
        dag = self.dag
        out = np.empty((max_steps, len(d)), dtype=np.int64)
        changes = np.empty(max_steps)
        k, done = _pd_run(d, max_steps, out, changes, self.block, self.qmin, self.qmax,
                          self.tab_ptr, self.cost_tab, dag.pred_ptr, dag.pred_idx,
                          self.succ_ptr, self.succ_idx, *self.work)
        return out[:k], changes[:k], bool(done)

    def points(self, rows: np.ndarray) -> list[FrontierPoint]:
        """Exact evaluation of the plans duration rows stand for."""
        dag = self.dag
        r = len(rows)
        times, energies, qtimes, qenergies, mtimes, menergies = (np.empty(r) for _ in range(6))
        opts = np.empty(rows.shape, dtype=np.int64)
        _evaluate_rows(rows, self.block, self.tab_ptr, self.qmin, self.opt_tab, self.opt_ptr,
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


@njit(cache=True)
def _lookup(freq, blk, opt_ptr, opt_freq, opt_time, opt_energy):
    n = len(freq)
    t = np.empty(n)
    e = np.empty(n)
    for i in range(n):
        b = blk[i]
        for k in range(opt_ptr[b], opt_ptr[b + 1]):
            if opt_freq[k] == freq[i]:
                t[i] = opt_time[k]
                e[i] = opt_energy[k]
    return t, e


def make_point(dag: InstructionDag, freq: np.ndarray, t: np.ndarray, e: np.ndarray,
               unit_s: float) -> FrontierPoint:
    """A FrontierPoint from per-node clocks, times and energies (module formula)."""
    p_block, n_st = dag.profile.blocking_power_w, dag.num_stages
    time_s = float(finish_times_kernel(t, dag.pred_ptr, dag.pred_idx).max())
    qt = np.floor(t / unit_s + _QEPS) * unit_s
    qtime = float(finish_times_kernel(qt, dag.pred_ptr, dag.pred_idx).max())
    return FrontierPoint(
        time_s=time_s, energy_j=float(e.sum() + p_block * (n_st * time_s - t.sum())),
        freq_mhz=freq,
        quant_time_s=round(qtime / unit_s) * unit_s,
        quant_energy_j=float((e - p_block * qt).sum() + n_st * p_block * qtime))


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
    (`_polish_kernel`), which reaches the slow, cheap options off the critical path without
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
    from trainsim.search.energy_baselines import all_max, tighten
    top = all_max(dag, unit_s=unit_s)
    extra = [tighten(dag, p.freq_mhz, top.time_s, unit_s=unit_s) for p in steps
             if p.time_s > top.time_s and p.quant_time_s <= steps[-1].quant_time_s + 2 * unit_s]
    candidates = steps + extra + [top]
    if polish:
        comp = _Compiled(dag, unit_s, cut)
        candidates += [comp.polish(p) for p in candidates]
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
