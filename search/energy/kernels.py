"""Compiled (numba) kernels of the energy frontier: the inner loops, over flat arrays.

search/energy/frontier.py holds the problem, the hulls and the public API; this module holds only
what runs per crashing step or per plan, each a numba kernel with no Python objects:

- `finish_times_kernel`: earliest finish of every node of a topologically ordered DAG (the
  longest path, CPM);
- `pd_run` (`_pd_step` per step): one Phillips–Dessouky step (Management Science 23(4), 1977) —
  critical subgraph, the cut network with each activity's lower bound substituted by two node
  arcs, a Dinic max flow (`_dinic`), the minimum cut, and the duration update;
- `evaluate_rows`: exact (real), Lowtime-quantised and crashing-model time/energy of a batch of
  duration rows;
- `polish_kernel`: slows every instruction into its real slack without lengthening the
  iteration;
- `lookup_options`: per-node time and energy of a per-node clock plan.

They are split from the Python side because they are the part whose speed matters (the whole
step is one kernel call), and numba caches them per file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_INF = 1e30
_EPS = 1e-9
#: Guard of ⌊t/u⌋ against binary rounding (0.003 / 0.001 = 2.9999999999999996).
QEPS = 1e-9


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
def pd_run(d, max_steps, out, changes, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx,
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
def evaluate_rows(rows, blk, tab_ptr, qmin, opt_tab, opt_ptr, opt_time, opt_energy,
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
            qt[i] = np.floor(t[i] / unit_s + QEPS) * unit_s
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
def polish_kernel(freq, blk, opt_ptr, opt_freq, opt_time, opt_energy, pred_ptr, pred_idx,
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



@njit(cache=True)
def lookup_options(freq, blk, opt_ptr, opt_freq, opt_time, opt_energy):
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
