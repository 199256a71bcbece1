"""The frontier's compiled pieces against plain references (issue 15, item 4).

The max flow against scipy's; a warm-started flow against one from zero (same value, same minimal
cut); crashing with warm starts against crashing without (the same rows, step by step);
`polish_rows` against a line-by-line Python version of the per-plan polish it replaced; and
`make_points` against `make_point`, to the bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from trainsim.search.energy.dag import build_dag
from trainsim.search.energy.frontier import _Compiled
from trainsim.search.energy.maxflow import EPS, add_arc, dinic, save_flow, warm_start
from trainsim.search.energy.point import FrontierPoint, make_point, make_points
from trainsim.search.energy.profile import EnergyProfile, InstructionOptions, load_perseus_csv

P_BLOCK = 60.0


def random_network(rng: np.random.Generator, nv: int, arcs: int
                   ) -> list[tuple[int, int, int]]:
    """(u, v, integer capacity) arcs of a random network on nv vertices, S = 0 and T = nv − 1."""
    out = []
    while len(out) < arcs:
        u, v = (int(x) for x in rng.integers(0, nv, 2))
        if u != v and v != 0 and u != nv - 1:
            out.append((u, v, int(rng.integers(1, 20))))
    return out


class Net:
    """Arc arrays as the crashing kernel keeps them."""

    def __init__(self, nv: int, arcs: list[tuple[int, int, int]]) -> None:
        m2 = 2 * len(arcs)
        self.nv = nv
        self.first = np.full(nv, -1, np.int64)
        self.nxt, self.to, self.frm = (np.zeros(m2, np.int64) for _ in range(3))
        self.res = np.zeros(m2)
        self.m = 0
        for u, v, c in arcs:
            self.m = add_arc(u, v, float(c), self.first, self.nxt, self.to, self.frm, self.res,
                             self.m)

    def dinic(self) -> float:
        work = [np.zeros(self.nv, np.int64) for _ in range(3)] + [np.zeros(self.m, np.int64)]
        return dinic(self.nv, 0, self.nv - 1, self.first, self.nxt, self.to, self.frm, self.res,
                     *work)

    def source_side(self) -> set[int]:
        """Vertices reachable from S in the residual network: the minimal minimum cut."""
        seen, stack = {0}, [0]
        while stack:
            u = stack.pop()
            for e in range(self.m):
                if self.frm[e] == u and self.res[e] > EPS and int(self.to[e]) not in seen:
                    seen.add(int(self.to[e]))
                    stack.append(int(self.to[e]))
        return seen


def scipy_max_flow(nv: int, arcs: list[tuple[int, int, int]]) -> int:
    u, v, c = (np.array(x) for x in zip(*arcs))
    graph = csr_matrix((c.astype(np.int32), (u, v)), shape=(nv, nv))  # parallel arcs add up
    return int(maximum_flow(graph, 0, nv - 1).flow_value)


@pytest.mark.parametrize("seed", range(6))
def test_dinic_equals_scipy_max_flow(seed: int) -> None:
    rng = np.random.default_rng(seed)
    nv = int(rng.integers(6, 30))
    arcs = random_network(rng, nv, int(rng.integers(nv, 5 * nv)))
    assert Net(nv, arcs).dinic() == pytest.approx(scipy_max_flow(nv, arcs), abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_warm_start_gives_the_same_flow_and_cut(seed: int) -> None:
    """A max flow, then new capacities on the same arcs: starting from the old flow (clipped and
    repaired) gives a feasible flow, and Dinic from there the same value and minimal cut."""
    rng = np.random.default_rng(100 + seed)
    nv = int(rng.integers(6, 30))
    arcs = random_network(rng, nv, int(rng.integers(nv, 5 * nv)))
    old = Net(nv, arcs)
    old.dinic()
    prev = np.array([-1], np.int64)
    prev_to, prev_frm = np.zeros(old.m, np.int64), np.zeros(old.m, np.int64)
    prev_flow = np.zeros(old.m)
    save_flow(old.m, old.to, old.frm, old.res, prev, prev_to, prev_frm, prev_flow)
    changed = [(u, v, max(1, c + int(rng.integers(-12, 7)))) for u, v, c in arcs]
    cold, warm = Net(nv, changed), Net(nv, changed)
    value = warm_start(warm.m, 0, nv - 1, warm.first, warm.nxt, warm.to, warm.frm, warm.res,
                       prev, prev_to, prev_frm, prev_flow, np.zeros(nv), np.zeros(nv, np.int64),
                       np.zeros(nv, np.int64))
    flow = warm.res[1:warm.m:2]
    caps = np.array([c for _, _, c in changed], dtype=float)
    assert np.all(flow >= 0) and np.all(flow <= caps + 1e-9)
    net = np.zeros(nv)
    np.add.at(net, warm.to[0:warm.m:2], flow)
    np.add.at(net, warm.frm[0:warm.m:2], -flow)
    assert np.abs(net[1:-1]).max(initial=0) <= 1e-9  # conservation
    assert value == pytest.approx(-net[0], abs=1e-9)
    assert value + warm.dinic() == pytest.approx(cold.dinic(), abs=1e-9)
    assert warm.source_side() == cold.source_side()


def random_profile(rng: np.random.Generator, stages: int, clocks: int, *,
                   monotone: bool = True, shuffle: bool = False) -> EnergyProfile:
    """Options whose time falls with the clock (with noise unless `monotone`) and whose energy
    has a minimum in between, so the hulls have several segments."""
    options = {}
    for s in range(stages):
        for inst, base in (("forward", 0.010), ("backward", 0.020)):
            freq = np.linspace(1410.0, 810.0, clocks)
            time_s = base * (1.0 + s / 10) * 1410.0 / freq
            if not monotone:
                time_s *= rng.uniform(0.97, 1.03, clocks)
            energy = time_s * (P_BLOCK + 200.0 * (freq / 1410.0) ** 2) \
                * rng.uniform(0.98, 1.02, clocks)
            order = rng.permutation(clocks) if shuffle else np.arange(clocks)
            options[(s, inst)] = InstructionOptions(freq_mhz=freq[order], time_s=time_s[order],
                                                    energy_j=energy[order])
    return EnergyProfile(num_stages=stages, blocking_power_w=P_BLOCK, options=options)


@pytest.mark.parametrize("monotone", [True, False])
def test_warm_started_crashing_makes_the_same_steps(monotone: bool) -> None:
    rng = np.random.default_rng(3)
    dag = build_dag(random_profile(rng, 4, 24, monotone=monotone), 8)
    comp = _Compiled(dag, 1e-3, P_BLOCK)
    warm_rows, _, warm_done = comp.run(comp.slowest(), 10_000)
    cold_rows, _, cold_done = comp.run(comp.slowest(), 10_000, warm=False)
    assert warm_done and cold_done and len(warm_rows) > 20
    np.testing.assert_array_equal(warm_rows, cold_rows)


def test_warm_started_crashing_on_the_perseus_profile(shared_subdir) -> None:
    """GPT-3 175B on A100, 12 micro-batches (about 640 steps)."""
    csv = Path(shared_subdir("perseus")) / "stage_profile" / "gpt3-175b+a100_sxm_bf16.csv"
    dag = build_dag(load_perseus_csv(csv, blocking_power_w=83.64), 12)
    comp = _Compiled(dag, 1e-3, 83.64)
    warm_rows, _, _ = comp.run(comp.slowest(), 100_000)
    cold_rows, _, _ = comp.run(comp.slowest(), 100_000, warm=False)
    np.testing.assert_array_equal(warm_rows, cold_rows)


def polish_reference(comp: _Compiled, freq: np.ndarray) -> tuple[np.ndarray, ...]:
    """The per-plan polish `polish_rows` replaced, line by line in Python: scan every option
    of the block for the node's clock (the last match) and for the cheapest that fits."""
    dag, ptr, p_block = comp.dag, comp.opt_ptr, comp.dag.profile.blocking_power_w
    n = dag.num_nodes

    def index(i: int, f: float) -> int:
        b = comp.block[i]
        hits = [k for k in range(ptr[b], ptr[b + 1]) if comp.opt_freq[k] == f]
        return hits[-1] if hits else int(ptr[b])

    cur = [index(i, freq[i]) for i in range(n)]
    t = comp.opt_time[cur]
    ef = dag.finish_times(t)
    ls, out = np.empty(n), np.empty(n)
    for i in range(n - 1, -1, -1):
        lf = min([ls[j] for j in comp.succ_idx[comp.succ_ptr[i]:comp.succ_ptr[i + 1]]],
                 default=ef.max())
        window = lf - (ef[i] - t[i])
        best = cur[i]
        best_c = comp.opt_energy[best] - p_block * comp.opt_time[best]
        b = comp.block[i]
        for k in range(ptr[b], ptr[b + 1]):
            if t[i] <= comp.opt_time[k] <= window:
                c = comp.opt_energy[k] - p_block * comp.opt_time[k]
                if c < best_c - 1e-12:
                    best, best_c = k, c
        ls[i] = lf - comp.opt_time[best]
        out[i] = comp.opt_freq[best]
    ks = [index(i, out[i]) for i in range(n)]
    return out, comp.opt_time[ks], comp.opt_energy[ks]


@pytest.mark.parametrize(("monotone", "shuffle"), [(True, False), (False, False), (False, True)])
def test_polish_rows_equals_the_reference(monotone: bool, shuffle: bool) -> None:
    """Random plans (and the crashing steps' plans) on profiles with times that fall with the
    clock, that do not, and with options in no clock order."""
    rng = np.random.default_rng(11)
    dag = build_dag(random_profile(rng, 3, 16, monotone=monotone, shuffle=shuffle), 4)
    comp = _Compiled(dag, 1e-3, P_BLOCK)
    plans = [comp.opt_freq[comp.opt_ptr[dag.block] + rng.integers(0, 16, dag.num_nodes)]
             for _ in range(12)]
    plans += [p.freq_mhz for p in comp.points(comp.run(comp.slowest(), 10_000)[0][::5])]
    points = comp.polish([make_point(dag, f, *dag.node_time_energy(f), 1e-3) for f in plans])
    for f, p in zip(plans, points):
        ref_f, ref_t, ref_e = polish_reference(comp, f)
        assert same_point(p, make_point(dag, ref_f, ref_t, ref_e, 1e-3))


def same_point(a: FrontierPoint, b: FrontierPoint) -> bool:
    """Every figure and clock equal, to the bit."""
    return (a.time_s, a.energy_j, a.quant_time_s, a.quant_energy_j) == \
        (b.time_s, b.energy_j, b.quant_time_s, b.quant_energy_j) and \
        np.array_equal(a.freq_mhz, b.freq_mhz)


def test_make_points_equals_make_point_bitwise() -> None:
    rng = np.random.default_rng(5)
    dag = build_dag(random_profile(rng, 4, 12), 6)
    comp = _Compiled(dag, 1e-3, P_BLOCK)
    ks = comp.opt_ptr[dag.block][None, :] + rng.integers(0, 12, (20, dag.num_nodes))
    freq, t, e = comp.opt_freq[ks], comp.opt_time[ks], comp.opt_energy[ks]
    for k, p in enumerate(make_points(dag, freq, t, e, 1e-3)):
        assert same_point(p, make_point(dag, freq[k], t[k], e[k], 1e-3))
