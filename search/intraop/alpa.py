"""Alpa's intra-operator ILP (Zheng et al., OSDI'22 §4.2) solved with HiGHS (scipy.optimize.milp).

Variables: a one-hot s_v over the options of every node v (a ParallelBlock: Alpa merges light
elementwise ops into their producers), and for every edge (u, v) a vector e_uv over option
pairs, linearised the way Alpa does: Σ_b e_uv[a, b] = s_u[a] and Σ_a e_uv[a, b] = s_v[b]
with 0 ≤ e ≤ 1, so e_uv is the outer product of the one-hots at any integer s. Objective:
Σ_v c_v·s_v + Σ_uv R_uv·e_uv with the α-β costs of `costs.AlphaBetaPricing` (or any other
pricing handed in). Memory: Σ_v m_v·s_v ≤ limit — exact here, because the lowering keeps every
activation from its forward to its backward, so the liveness peak is the sum.

The solver runs under a time limit; the result carries HiGHS's MIP gap (0 = proven optimal).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from trainsim.search.intraop.problem import Problem

US = 1e6
"""The objective is handed to HiGHS in microseconds."""


@dataclass(frozen=True, slots=True)
class IlpResult:
    """What the solver returned."""

    choice: list[int] | None
    """Option per block (None: infeasible or no solution in time)."""
    objective_s: float
    mip_gap: float
    """HiGHS's relative gap between the incumbent and the bound (0: optimal)."""
    status: str
    solve_s: float
    variables: int


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS prints some messages from C++ straight to file descriptor 1 even with disp off,
    which would corrupt `sim search --json`: point it at /dev/null while the solver runs."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (embedded): nothing to protect
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve_ilp(problem: Problem, memory_limit_bytes: float | None = None,
              time_limit_s: float = 60.0) -> IlpResult:
    """Minimise the plan cost over the problem's options subject to the memory limit."""
    offsets = []
    n = 0
    for t in problem.time_s:
        offsets.append(n)
        n += len(t)
    edge_off = []
    for e in problem.edges:
        edge_off.append(n)
        n += e.cost.size
    c = np.zeros(n)
    for b, t in enumerate(problem.time_s):
        c[offsets[b]:offsets[b] + len(t)] = t
    for e, off in zip(problem.edges, edge_off, strict=True):
        c[off:off + e.cost.size] = e.cost.ravel()
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add_row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        """One constraint low <= Σ val·x[col] <= high."""
        r = len(lo)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)

    for b, t in enumerate(problem.time_s):  # one-hot
        add_row([(offsets[b] + k, 1.0) for k in range(len(t))], 1.0, 1.0)
    for e, off in zip(problem.edges, edge_off, strict=True):
        na, nb = e.cost.shape
        for a in range(na):  # Σ_b e[a, b] = s_u[a]
            add_row([(off + a * nb + bb, 1.0) for bb in range(nb)]
                    + [(offsets[e.src] + a, -1.0)], 0.0, 0.0)
        for bb in range(nb):  # Σ_a e[a, b] = s_v[b]
            add_row([(off + a * nb + bb, 1.0) for a in range(na)]
                    + [(offsets[e.dst] + bb, -1.0)], 0.0, 0.0)
    if memory_limit_bytes is not None:
        add_row([(offsets[b] + k, float(m[k]) / 2**30)
                 for b, m in enumerate(problem.memory_bytes) for k in range(len(m))],
                -np.inf, memory_limit_bytes / 2**30)
    r = len(lo)
    c *= US  # HiGHS stops at an absolute gap of 1e-6: in seconds that is a 1e-5 relative gap
    a_mat = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
    integrality = np.zeros(n)
    integrality[:edge_off[0] if edge_off else n] = 1
    start = time.perf_counter()
    with _quiet_stdout():
        res = milp(c, constraints=LinearConstraint(a_mat, lo, hi), integrality=integrality,
                   bounds=Bounds(0.0, 1.0),
                   options={"time_limit": time_limit_s, "disp": False, "mip_rel_gap": 0.0})
    solve_s = time.perf_counter() - start
    gap = float(getattr(res, "mip_gap", np.nan) or 0.0) if res.x is not None else float("nan")
    if res.x is None:
        return IlpResult(choice=None, objective_s=float("inf"), mip_gap=gap,
                         status=str(res.message), solve_s=solve_s, variables=n)
    choice = [int(np.argmax(res.x[offsets[b]:offsets[b] + len(t)]))
              for b, t in enumerate(problem.time_s)]
    return IlpResult(choice=choice, objective_s=float(res.fun) / US, mip_gap=gap,
                     status="optimal" if res.status == 0 else str(res.message),
                     solve_s=solve_s, variables=n)


__all__ = ["IlpResult", "solve_ilp"]
