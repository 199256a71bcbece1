"""Compiled (numba) max flow for the crashing step's cut network (search/energy/kernels.py).

The network is kept as arc arrays with per-vertex linked lists (`first`, `nxt`); arc e's
reverse is e ^ 1. Two things make it fast on the Phillips–Dessouky networks, where every
critical instruction has a source arc into its `out` vertex and a sink arc out of its `in`
vertex (the substituted lower bounds) and most of the flow is those short paths:

- `saturate_pairs` first pushes, greedily, S → out_i → in_j → T along every critical edge i → j
  (about four of five augmenting paths of a step on the GPT-3 175B profiles);
- `dinic` levels vertices by their residual distance *to the sink* (a BFS backwards from T that
  stops once S is reached), so a phase only visits vertices that can still reach T; the
  forward BFS from S of a textbook Dinic visits the whole network every phase, because the
  infinite precedence arcs make everything reachable from S;
- `warm_start` begins from the previous step's flow (`save_flow`) when the network has the same
  arcs, which is most steps: a crashing step changes a few instructions' capacities, so Dinic
  then only re-augments around them (GPT-3 175B, 96 micro-batches: about 24 Dinic phases per
  step from scratch).

numba caches a kernel per source file and does not see edits to the kernels it calls in other
files: after changing this module, clear search/energy/__pycache__ (or touch kernels.py).

Any maximum flow leaves the same set of vertices reachable from S in its residual network (the
source side of the minimal minimum cut), so none of the three changes which instructions a step
crashes (tests/search/test_energy_kernels.py checks it step by step).
"""

from __future__ import annotations

from numba import njit

INF = 1e30
EPS = 1e-9
#: Imbalance `warm_start` leaves (rounding: flows are tens of joules).
_TOL = 1e-12


@njit(cache=True)
def add_arc(u, v, cap, first, nxt, to, frm, res, m):
    """Arc u → v of capacity `cap` and its zero-capacity reverse at m, m + 1; returns m + 2."""
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
def saturate_pairs(n, m, to, frm, res, arc_s, arc_t):
    """Greedy flow over the paths S → out_i → in_j → T, arcs in the order they were added.

    Vertices 2i / 2i + 1 are in_i / out_i (i < n); arc_s[i] is the arc S → out_i and arc_t[j]
    the arc in_j → T, or −1. Returns the flow pushed.
    """
    total = 0.0
    for e in range(0, m, 2):
        u, v = frm[e], to[e]
        if u & 1 == 0 or v & 1 == 1 or v >= 2 * n or u // 2 == v // 2:
            continue  # not a precedence arc out_i → in_j
        a, b = arc_s[u // 2], arc_t[v // 2]
        if a < 0 or b < 0:
            continue
        x = min(res[a], res[b])
        if x > 0.0:
            res[a] -= x
            res[a ^ 1] += x
            res[e] -= x
            res[e ^ 1] += x
            res[b] -= x
            res[b ^ 1] += x
            total += x
    return total


@njit(cache=True)
def dinic(nv, s, t, first, nxt, to, frm, res, level, it, queue, path):
    """Max flow s → t on the residual arrays (modified in place); stops early past INF/2.

    `level` is each vertex's residual distance to t (−1: cannot reach t, or a dead end).
    """
    flow = 0.0
    while True:
        for v in range(nv):
            level[v] = -1
        level[t] = 0
        qh, qt = 0, 1
        queue[0] = t
        while qh < qt:
            u = queue[qh]
            qh += 1
            if level[s] >= 0 and level[u] >= level[s]:
                break
            e = first[u]
            while e != -1:
                w = to[e]
                if res[e ^ 1] > EPS and level[w] < 0:  # arc w → u has residual capacity
                    level[w] = level[u] + 1
                    queue[qt] = w
                    qt += 1
                e = nxt[e]
        if level[s] < 0:
            return flow
        for v in range(nv):
            it[v] = first[v]
        u = s
        top = 0
        while True:
            if u == t:
                push = INF * 10.0
                for k in range(top):
                    push = min(push, res[path[k]])
                for k in range(top):
                    res[path[k]] -= push
                    res[path[k] ^ 1] += push
                flow += push
                if flow >= INF / 2:
                    return flow
                # retreat to the tail of the first saturated arc of the path
                cut = 0
                while cut < top - 1 and res[path[cut]] > EPS:
                    cut += 1
                top = cut
                u = frm[path[cut]]
                continue
            e = it[u]
            while e != -1 and not (res[e] > EPS and level[to[e]] >= 0
                                   and level[to[e]] == level[u] - 1):
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
def warm_start(m, s, t, first, nxt, to, frm, res, prev, prev_to, prev_frm, prev_flow, exc,
               stack, queued):
    """Start from a previous network's flow when this network has the same arcs.

    `prev[0]` arcs `prev_to`/`prev_frm` carried `prev_flow` (per forward arc, even index). Each
    arc's flow is clipped to its new capacity, two-arc cycles (in_k ⇄ out_k) are cancelled, and
    conservation is restored by cancelling flow back towards S from vertices with excess and on
    towards T from vertices with deficit, so what is left is a feasible flow. Returns its value
    (0.0 with the network untouched when the arcs differ).
    """
    if prev[0] != m:
        return 0.0
    for e in range(m):
        if to[e] != prev_to[e] or frm[e] != prev_frm[e]:
            return 0.0
    for e in range(0, m, 2):
        x = min(prev_flow[e], res[e])
        if x > 0.0:
            res[e] -= x
            res[e + 1] += x
    for e in range(2, m, 2):  # back arc out_k → in_k right after its through arc in_k → out_k
        if to[e] == frm[e] - 1 and frm[e] & 1 and frm[e - 2] == to[e] and to[e - 2] == frm[e]:
            y = min(res[e + 1], res[e - 1])
            if y > 0.0:
                res[e + 1] -= y
                res[e] += y
                res[e - 1] -= y
                res[e - 2] += y
    nv = len(exc)
    for v in range(nv):
        exc[v] = 0.0
        queued[v] = 0
    for e in range(0, m, 2):
        exc[to[e]] += res[e + 1]
        exc[frm[e]] -= res[e + 1]
    top = 0
    for v in range(nv):
        if v != s and v != t and abs(exc[v]) > _TOL:
            stack[top] = v
            queued[v] = 1
            top += 1
    while top > 0:
        top -= 1
        u = stack[top]
        queued[u] = 0
        e = first[u]
        while e != -1 and abs(exc[u]) > _TOL:
            if exc[u] > 0.0 and e & 1 and res[e] > 0.0:  # less flow on arc to[e] → u
                x = min(res[e], exc[u])
                w = to[e]
                sign = 1.0
            elif exc[u] < 0.0 and e & 1 == 0 and res[e + 1] > 0.0:  # less on u → to[e]
                x = min(res[e + 1], -exc[u])
                w = to[e]
                sign = -1.0
            else:
                e = nxt[e]
                continue
            res[e] -= sign * x
            res[e ^ 1] += sign * x
            exc[u] -= sign * x
            if w != s and w != t:
                exc[w] += sign * x
                if not queued[w] and abs(exc[w]) > _TOL:
                    stack[top] = w
                    queued[w] = 1
                    top += 1
            e = nxt[e]
    value = 0.0
    for e in range(0, m, 2):
        if frm[e] == s:
            value += res[e + 1]
    return value


@njit(cache=True)
def save_flow(m, to, frm, res, prev, prev_to, prev_frm, prev_flow):
    """Remember this network's arcs and flow for `warm_start`."""
    prev[0] = m
    for e in range(m):
        prev_to[e] = to[e]
        prev_frm[e] = frm[e]
    for e in range(0, m, 2):
        prev_flow[e] = res[e + 1]
