"""Compiled (numba) kernels of the energy frontier: the inner loops, over flat arrays.

search/energy/frontier.py holds the problem, the hulls and the public API; this module holds only
what runs per crashing step or per plan, each a numba kernel with no Python objects:

- `finish_times_kernel`: earliest finish of every node of a topologically ordered DAG (the
  longest path, CPM); `makespans_kernel`: the longest path of many duration rows;
- `pd_run` (`_pd_step` per step): one Phillips–Dessouky step (Management Science 23(4), 1977) —
  critical subgraph, the cut network with each activity's lower bound substituted by two node
  arcs, its max flow (search/energy/maxflow.py), the minimum cut, and the duration update;
- `evaluate_rows`: exact (real), Lowtime-quantised and crashing-model time/energy of a batch of
  duration rows;
- `polish_rows`: slows every instruction of a batch of plans into its real slack without
  lengthening the iteration.

They are split from the Python side because they are the part whose speed matters (the whole
step is one kernel call), and numba caches them per file.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from trainsim.search.energy.maxflow import (
    EPS,
    INF,
    add_arc,
    dinic,
    saturate_pairs,
    save_flow,
    warm_start,
)

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
def makespans_kernel(durations, pred_ptr, pred_idx):
    """Longest path of each row of (plans × nodes) durations."""
    out = np.empty(durations.shape[0])
    for r in range(durations.shape[0]):
        out[r] = finish_times_kernel(durations[r], pred_ptr, pred_idx).max()
    return out


@njit(cache=True)
def _pd_step(d, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx, succ_ptr, succ_idx,
             es, ls, first, nxt, to, frm, res, level, it, queue, path, arc_s, arc_t, prev,
             prev_to, prev_frm, prev_flow, exc):
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
        f = INF if d[i] <= qmin[b] else cost_tab[base + d[i] - 1] - c_here
        g = 0.0 if d[i] >= qmax[b] else c_here - cost_tab[base + d[i] + 1]
        g = max(g, 0.0)
        cap = INF if f >= INF else max(f - g, 0.0)
        m = add_arc(2 * i, 2 * i + 1, cap, first, nxt, to, frm, res, m)
        if d[i] >= qmax[b]:
            m = add_arc(2 * i + 1, 2 * i, INF, first, nxt, to, frm, res, m)
        arc_t[i] = -1
        arc_s[i] = -1
        if g > 0.0:
            arc_t[i] = m
            m = add_arc(2 * i, t_node, g, first, nxt, to, frm, res, m)
            arc_s[i] = m
            m = add_arc(s_node, 2 * i + 1, g, first, nxt, to, frm, res, m)
            g_sum += g
        if pred_ptr[i] == pred_ptr[i + 1]:
            m = add_arc(s_node, 2 * i, INF, first, nxt, to, frm, res, m)
        if succ_ptr[i] == succ_ptr[i + 1] and es[i] + d[i] == makespan:
            m = add_arc(2 * i + 1, t_node, INF, first, nxt, to, frm, res, m)
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            if es[j] == ls[j] and es[i] + d[i] == es[j]:
                m = add_arc(2 * i + 1, 2 * j, INF, first, nxt, to, frm, res, m)
    flow = warm_start(m, s_node, t_node, first, nxt, to, frm, res, prev, prev_to, prev_frm,
                      prev_flow, exc, queue, level)
    flow += saturate_pairs(n, m, to, frm, res, arc_s, arc_t)
    flow += dinic(nv, s_node, t_node, first, nxt, to, frm, res, level, it, queue, path)
    if flow >= INF / 2:
        return 1, 0.0
    save_flow(m, to, frm, res, prev, prev_to, prev_frm, prev_flow)
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
            if res[e] > EPS and level[to[e]] == 0:
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
def pd_run(d, max_steps, warm, out, changes, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr,
           pred_idx, succ_ptr, succ_idx, es, ls, first, nxt, to, frm, res, level, it, queue,
           path, arc_s, arc_t, prev, prev_to, prev_frm, prev_flow, exc):
    """Up to `max_steps` steps; row k of `out` gets the durations after step k. Returns the
    number of steps done and whether the fastest makespan was reached. `warm`: each step's max
    flow starts from the last one's where it can (False: from zero, the same cuts, slower)."""
    for k in range(max_steps):
        if not warm:
            prev[0] = -1
        status, change = _pd_step(d, blk, qmin, qmax, tab_ptr, cost_tab, pred_ptr, pred_idx,
                                  succ_ptr, succ_idx, es, ls, first, nxt, to, frm, res, level,
                                  it, queue, path, arc_s, arc_t, prev, prev_to, prev_frm,
                                  prev_flow, exc)
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
def _option_index(f, lo, hi, opt_freq, descending):
    """Index of the last option of block [lo, hi) at clock f (−1: none): a binary search where
    the clocks are descending (`descending`, as profiles keep them), else a scan."""
    if descending:
        a, z = lo, hi
        while a < z:  # first index whose clock is below f
            mid = (a + z) // 2
            if opt_freq[mid] >= f:
                a = mid + 1
            else:
                z = mid
        return a - 1 if a > lo and opt_freq[a - 1] == f else -1
    found = -1
    for k in range(lo, hi):
        if opt_freq[k] == f:
            found = k
    return found


@njit(cache=True)
def _best_option(cur, t_cur, window, lo, hi, opt_time, opt_energy, time_ord, sorted_time, buf,
                 p_block):
    """The option of least effective energy among those of block [lo, hi) taking between
    t_cur and window, `cur` unless one is cheaper by over 1e-12 J (the first in block order
    on near-ties)."""
    a = lo + np.searchsorted(sorted_time[lo:hi], t_cur, side="left")
    z = lo + np.searchsorted(sorted_time[lo:hi], window, side="right")
    best, best_c = cur, opt_energy[cur] - p_block * opt_time[cur]
    if 4 * (z - a) >= hi - lo:  # many fit: scan the block
        for k in range(lo, hi):
            if opt_time[k] >= t_cur and opt_time[k] <= window:
                c = opt_energy[k] - p_block * opt_time[k]
                if c < best_c - 1e-12:
                    best, best_c = k, c
        return best
    r = 0
    for q in range(a, z):  # the ones that fit, insertion-sorted into block order
        k = time_ord[q]
        j = r
        while j > 0 and buf[j - 1] > k:
            buf[j] = buf[j - 1]
            j -= 1
        buf[j] = k
        r += 1
    for j in range(r):
        k = buf[j]
        c = opt_energy[k] - p_block * opt_time[k]
        if c < best_c - 1e-12:
            best, best_c = k, c
    return best


@njit(cache=True)
def polish_rows(freqs, blk, opt_ptr, opt_freq, opt_time, opt_energy, next_time, time_ord,
                pred_ptr, pred_idx, succ_ptr, succ_idx, p_block):
    """Slow every instruction of each plan (row of clocks) into its slack without lengthening
    the iteration; returns the polished (clocks, times, energies), one row per plan.

    Reverse topological sweep: node i may take any option no faster than its current one that
    fits between its earliest start (predecessors at their current speeds) and the latest start
    of its successors (already placed as late as possible); it takes the one of least effective
    energy E − P_block·t. Predecessors keep room for their current speed, so the makespan does
    not grow and the plan's energy does not rise. `next_time[k]`: the least time of another
    option of k's block no faster than k (inf: none); a node whose window ends before it keeps
    its option without a look at the others. `time_ord`: each block's options by time (stable);
    the options that fit are a range of it, visited in the block's order (`_best_option`).
    """
    rows, n = freqs.shape
    descending = True  # within every block; strictly: no clock twice, an option is its clock's
    strict = True
    for b in range(len(opt_ptr) - 1):
        for k in range(opt_ptr[b], opt_ptr[b + 1] - 1):
            descending = descending and opt_freq[k + 1] <= opt_freq[k]
            strict = strict and opt_freq[k + 1] < opt_freq[k]
    out_f = np.empty((rows, n))
    out_t = np.empty((rows, n))
    out_e = np.empty((rows, n))
    cur = np.empty(n, np.int64)
    t = np.empty(n)
    ls = np.empty(n)
    sorted_time = opt_time[time_ord]
    buf = np.empty(len(opt_time), np.int64)
    for r in range(rows):
        for i in range(n):
            b = blk[i]
            k = _option_index(freqs[r, i], opt_ptr[b], opt_ptr[b + 1], opt_freq, descending)
            cur[i] = opt_ptr[b] if k < 0 else k
            t[i] = opt_time[cur[i]]
        ef = finish_times_kernel(t, pred_ptr, pred_idx)
        makespan = ef.max()
        for i in range(n - 1, -1, -1):
            lf = makespan
            for k in range(succ_ptr[i], succ_ptr[i + 1]):
                lf = min(lf, ls[succ_idx[k]])
            window = lf - (ef[i] - t[i])
            b = blk[i]
            best = cur[i]
            if window >= next_time[best]:
                best = _best_option(best, t[i], window, opt_ptr[b], opt_ptr[b + 1], opt_time,
                                    opt_energy, time_ord, sorted_time, buf, p_block)
            ls[i] = lf - opt_time[best]
            f = opt_freq[best]
            k = best if strict else _option_index(f, opt_ptr[b], opt_ptr[b + 1], opt_freq,
                                                  descending)
            out_f[r, i] = f
            out_t[r, i] = opt_time[k]
            out_e[r, i] = opt_energy[k]
    return out_f, out_t, out_e
