"""Ring orders inside a node, the way NCCL builds them: along NVLink neighbours.

On a point-to-point NVLink node (DGX-1's hybrid cube-mesh of V100s, A40 bridge pairs) a ring in
rank order crosses GPU pairs that have no NVLink (DGX-1: 3 -> 4 and 7 -> 0 go over PCIe and the
host). NCCL instead searches its topology graph for rings whose every hop is an NVLink and
runs several of them side by side (channels), so that every NVLink lane carries part of the
data (Jeaugey, "NCCL 2.0", GTC 2017; NCCL src/graph/search.cc, ncclTopoCompute). Two results:

- `node_rings`: for the members of one node, the weighted directed Hamiltonian cycles that
  carry a collective. If cycles made only of direct NVLinks exist, the data is split over them
  with weights from a linear programme (scipy HiGHS) that minimises the time of the busiest
  link (load / bandwidth): NCCL's channels, spread so that every lane is used. Otherwise
  one ring: the order whose slowest hop is fastest, the first in rank order on ties (so
  NVSwitch and PCIe nodes, where every hop is alike, keep rank order).
- `node_path`: the order in which a ring that spans several nodes visits one node's members:
  the best single ring above, cut at its slowest hop (at the closing hop on ties).

Searching is exhaustive over (n−1)! orders, so it is done for n ≤ `MAX_SEARCHED` and cached per
hop structure (which pairs are NVLink neighbours and the hop bandwidths), not per cluster.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import cache

Hop = tuple[bool, float]
"""(the pair is joined by one direct NVLink, bandwidth of the slowest link on its path)."""

Cycle = tuple[tuple[int, ...], float]
"""(members in ring order, share of the data it carries)."""

MAX_SEARCHED = 8
"""Largest group whose ring order is searched ((n−1)! = 5040 orders at 8)."""

_WEIGHT_FLOOR = 1e-9
"""LP weights below this are dropped (solver noise) and the rest renormalised."""


def _structure(members: Sequence[int], hop: Callable[[int, int], Hop]
               ) -> tuple[tuple[Hop, ...], ...]:
    return tuple(tuple(hop(a, b) if a != b else (False, 0.0) for b in members) for a in members)


def _uniform(structure: tuple[tuple[Hop, ...], ...]) -> bool:
    hops = {structure[i][j] for i in range(len(structure))
            for j in range(len(structure)) if i != j}
    return len(hops) == 1 and not next(iter(hops))[0]


@cache
def _searched(structure: tuple[tuple[Hop, ...], ...]) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Weighted cycles as index tuples for one hop structure (see module docstring)."""
    n = len(structure)
    orders = [(0, *rest) for rest in itertools.permutations(range(1, n))]

    def hops(order: tuple[int, ...]) -> list[tuple[int, int]]:
        return [(order[i], order[(i + 1) % n]) for i in range(n)]

    nvlink = [o for o in orders if all(structure[a][b][0] for a, b in hops(o))]
    if not nvlink:
        best = max(orders, key=lambda o: min(structure[a][b][1] for a, b in hops(o)))
        return ((best, 1.0),)
    return _balanced(structure, nvlink, hops)


def _balanced(structure: tuple[tuple[Hop, ...], ...], cycles: list[tuple[int, ...]],
              hops: Callable[[tuple[int, ...]], list[tuple[int, int]]]
              ) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Weights over NVLink `cycles` (summing to 1) minimising the busiest link's time."""
    from scipy.optimize import linprog  # here: only nodes with NVLink meshes need scipy

    links = sorted({h for c in cycles for h in hops(c)})
    row = {link: i for i, link in enumerate(links)}
    # variables: one weight per cycle, then t; minimise t
    a_ub = [[0.0] * (len(cycles) + 1) for _ in links]
    fastest = max(structure[a][b][1] for a, b in links)  # time in units of the fastest link
    for j, c in enumerate(cycles):
        for a, b in hops(c):
            a_ub[row[(a, b)]][j] += fastest / structure[a][b][1]
    for r in a_ub:
        r[-1] = -1.0
    cost = [0.0] * len(cycles) + [1.0]
    result = linprog(cost, A_ub=a_ub, b_ub=[0.0] * len(links),
                     A_eq=[[1.0] * len(cycles) + [0.0]], b_eq=[1.0],
                     bounds=[(0, None)] * (len(cycles) + 1), method="highs")
    if not result.success:  # cannot happen for a feasible simplex; keep one ring then
        return ((cycles[0], 1.0),)
    kept = [(c, float(w)) for c, w in zip(cycles, result.x[:-1], strict=True)
            if w > _WEIGHT_FLOOR]
    total = sum(w for _, w in kept)
    return tuple((c, w / total) for c, w in kept)


def node_rings(members: Sequence[int], hop: Callable[[int, int], Hop]) -> list[Cycle]:
    """Weighted directed rings over `members` (ranks of one node) as NCCL would build them."""
    members = list(members)
    if len(members) <= 2 or len(members) > MAX_SEARCHED:
        return [(tuple(members), 1.0)]
    structure = _structure(members, hop)
    if _uniform(structure):
        return [(tuple(members), 1.0)]
    return [(tuple(members[i] for i in order), w) for order, w in _searched(structure)]


def node_path(members: Sequence[int], hop: Callable[[int, int], Hop],
              rings: Sequence[Cycle] | None = None) -> list[int]:
    """Order in which a multi-node ring visits `members`: the heaviest of `rings` (default
    `node_rings(members, hop)`), cut at its slowest hop (the closing hop first among equals)."""
    if len(members) <= 2:
        return list(members)
    order = list(max(rings or node_rings(members, hop), key=lambda r: r[1])[0])
    n = len(order)
    cuts = [n - 1, *range(n - 1)]  # hop i joins order[i] -> order[i + 1 mod n]
    speed = [hop(order[i], order[(i + 1) % n])[1] for i in range(n)]
    cut = min(cuts, key=lambda i: speed[i])
    return order[cut + 1:] + order[:cut + 1]


__all__ = ["MAX_SEARCHED", "Cycle", "Hop", "node_path", "node_rings"]
