"""CFP (arXiv 2504.00598): ParallelBlocks, segment hashing, Oracle profiling, DP over segments.

1. Blocks (`blocks.build_blocks`): a block's options are its opening op's strategies, the rest
   propagating with no communication.
2. Segments are the zoo's layers; layers built from one zoo `Layer` share a key, and blocks
   with one key are measured once: each option of each distinct block runs on the engine
   (`problem.build_problem(engine=True)`), so a 24-layer GPT costs the evaluations of one
   layer plus the embedding and the head. `oracle_evaluations` counts the engine runs.
3. DP over segments: cost(i, σ) = min over τ of cost(i−1, τ) + seg_i(τ → σ), where
   seg(τ → σ) is the cheapest way through the segment entered with its input laid out as τ
   and leaving its output as σ, reshard(τ → first block) included. It is computed once per
   (segment key, τ) by an inner DP over the segment's blocks whose state is the layout of
   every tensor still to be read (the chain and the residual stream).
4. A memory limit is met by Lagrangian relaxation: minimise time + λ·memory, with λ found by
   bisection (memory is additive over blocks, so the DP stays exact for each λ); with λ → ∞
   the DP gives the least memory any plan needs, which the error for an unsolvable limit
   quotes. The relaxation can miss a constrained optimum that no λ selects (a duality gap);
   the ILP is exact there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainsim.search.intraop.costs import AlphaBetaPricing, OraclePricing
from trainsim.search.intraop.problem import Problem, edge_cost_s
from trainsim.workloads.sharding.spec import Spec

GIB = 2.0**30
ENTRY = -1
"""State key of a segment's input tensor (produced by the previous segment)."""

State = tuple[tuple[int, Spec], ...]


@dataclass(frozen=True, slots=True)
class DpResult:
    """The best plan for one λ: option per block, its time (s) and memory (bytes)."""

    choice: list[int]
    time_s: float
    memory_bytes: float


@dataclass(slots=True)
class _Segment:
    blocks: list[int]
    """Block indices of the representative layer."""
    first_node: int
    last_node: int
    live_after: list[set[int]]
    """Per block position: producers (node index, or ENTRY) read after it."""
    exit_node: int | None
    """The producer whose tensor the next segment reads (None for the last segment)."""


@dataclass(slots=True)
class _Compiled:
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]
    """Per block position: (source state, option, next state, resharding time) arrays of
    every transition, and the number of next states."""
    exits: list[Spec | None]
    """Per final state: the layout of the tensor handed to the next segment."""


class CfpSolver:
    """Segment-level DP over a problem priced on the Oracle (module docstring)."""

    def __init__(self, problem: Problem, pricing: OraclePricing | AlphaBetaPricing,
                 share: CfpSolver | None = None) -> None:
        """`share`: a solver of the same blocks and edges (other block times) whose compiled
        segment graphs this one reuses."""
        self.p, self.pricing = problem, pricing
        graph = problem.graph
        self.layer_blocks: list[list[int]] = [[] for _ in graph.layer_names]
        for block in problem.blocks:
            self.layer_blocks[graph.nodes[block.nodes[0]].layer].append(block.index)
        consumers = graph.consumers()
        self.segments: dict[int, _Segment] = {}
        self.layer_key = list(graph.segment_keys)
        for layer, key in enumerate(self.layer_key):
            if key in self.segments:
                continue
            blocks = self.layer_blocks[layer]
            first = problem.blocks[blocks[0]].nodes[0]
            last = problem.blocks[blocks[-1]].nodes[-1]
            live: list[set[int]] = []
            exit_node = None
            for pos in range(len(blocks)):
                later = {n for b in blocks[pos + 1:] for n in problem.blocks[b].nodes}
                alive: set[int] = set()
                for n in range(first, last + 1):
                    if n > problem.blocks[blocks[pos]].nodes[-1]:
                        break
                    for dst, _slot in consumers[n]:
                        if dst in later or dst > last:
                            alive.add(n)
                for later_block in blocks[pos + 1:]:
                    for n in problem.blocks[later_block].nodes:
                        if any(s < first for s in graph.nodes[n].srcs):
                            alive.add(ENTRY)
                live.append(alive)
            outside = {n for n in range(first, last + 1) if any(d > last for d, _ in consumers[n])}
            if len(outside) > 1:
                raise ValueError(f"segment {graph.layer_names[layer]} hands on {len(outside)} "
                                 f"tensors; CFP's DP needs one")
            exit_node = next(iter(outside)) if outside else None
            self.segments[key] = _Segment(blocks=blocks, first_node=first, last_node=last,
                                          live_after=live, exit_node=exit_node)
        self._memo: dict[tuple[int, Spec | None, float, float],
                         dict[Spec | None, tuple[float, float, float, list[int]]]] = {}
        self._compiled: dict[tuple[int, Spec | None], _Compiled] = \
            share._compiled if share is not None else {}

    def _compile(self, key: int, entry: Spec | None) -> _Compiled:
        """The inner DP's graph for segment `key` entered as `entry`: per block position, every
        transition (state, option) -> next state with its resharding time. Built once; each λ
        then runs on arrays (`_through`)."""
        ck = (key, entry)
        found = self._compiled.get(ck)
        if found is not None:
            return found
        seg = self.segments[key]
        p = self.p
        graph = p.graph
        states: list[State] = [((ENTRY, entry),) if entry is not None else ()]
        steps = []
        for pos, b in enumerate(seg.blocks):
            block = p.blocks[b]
            index: dict[State, int] = {}
            src_l, k_l, dst_l, e_l = [], [], [], []
            external = [(n, st_pos, slot, src) for st_pos, n in enumerate(block.nodes)
                        for slot, src in enumerate(graph.nodes[n].srcs)
                        if src not in block.nodes]
            memo: dict[tuple[int, tuple[Spec | None, ...]], float] = {}
            for si, state in enumerate(states):
                specs = dict(state)
                ext = tuple(specs[src if src >= seg.first_node else ENTRY]
                            for _n, _p, _s, src in external)
                for k, opt in enumerate(block.options):
                    edge = memo.get((k, ext))
                    if edge is None:
                        edge = sum(edge_cost_s(self.pricing, graph, spec, opt[st_pos], n, slot,
                                               p.edge_cache)
                                   for (n, st_pos, slot, _src), spec in zip(external, ext,
                                                                           strict=True)
                                   if spec is not None)
                        memo[(k, ext)] = edge
                    outs = dict(zip(block.nodes, (x.out_spec for x in opt), strict=True))
                    new = tuple(sorted((src, outs[src] if src in outs else specs[src])
                                       for src in seg.live_after[pos]))
                    src_l.append(si)
                    k_l.append(k)
                    dst_l.append(index.setdefault(new, len(index)))
                    e_l.append(edge)
            steps.append((np.asarray(src_l), np.asarray(k_l), np.asarray(dst_l),
                          np.asarray(e_l), len(index)))
            states = list(index)
        exits: list[Spec | None] = [dict(state).get(seg.exit_node) if seg.exit_node is not None
                                    else None for state in states]
        found = self._compiled[ck] = _Compiled(steps=steps, exits=exits)
        return found

    def _through(self, key: int, entry: Spec | None, w_time: float, lam: float
                 ) -> dict[Spec | None, tuple[float, float, float, list[int]]]:
        """Per exit layout: (objective, time, memory, option per block) of the best way
        through segment `key` entered as `entry`."""
        memo_key = (key, entry, w_time, lam)
        if memo_key in self._memo:
            return self._memo[memo_key]
        comp = self._compile(key, entry)
        seg = self.segments[key]
        cost = np.zeros(1)
        backs = []
        for (src, k, dst, edge, n_dst), b in zip(comp.steps, seg.blocks, strict=True):
            t = self.p.time_s[b][k] + edge
            vals = cost[src] + w_time * t + lam * self.p.memory_bytes[b][k] / GIB
            order = np.lexsort((vals, dst))
            keep = np.ones(len(order), dtype=bool)
            keep[1:] = dst[order][1:] != dst[order][:-1]
            first = order[keep]
            arg = np.full(n_dst, -1)
            arg[dst[first]] = first
            cost = np.full(n_dst, np.inf)
            cost[dst[first]] = vals[first]
            backs.append(arg)
        out: dict[Spec | None, tuple[float, float, float, list[int]]] = {}
        for state, exit_spec in enumerate(comp.exits):
            if exit_spec in out and out[exit_spec][0] <= cost[state]:
                continue
            picks: list[int] = []
            time_s = mem = 0.0
            cur = state
            for pos in range(len(seg.blocks) - 1, -1, -1):
                src, k, _dst, edge, _n = comp.steps[pos]
                tr = backs[pos][cur]
                b = seg.blocks[pos]
                picks.append(int(k[tr]))
                time_s += float(self.p.time_s[b][k[tr]] + edge[tr])
                mem += float(self.p.memory_bytes[b][k[tr]])
                cur = int(src[tr])
            out[exit_spec] = (float(cost[state]), time_s, mem, picks[::-1])
        self._memo[memo_key] = out
        return out

    def solve(self, w_time: float = 1.0, lam: float = 0.0) -> DpResult:
        """The plan minimising w_time·time + lam·memory (GiB) (outer DP over layers)."""
        layers: dict[Spec | None, tuple[float, float, float, list[list[int]]]] = {
            None: (0.0, 0.0, 0.0, [])}
        for key in self.layer_key:
            nxt: dict[Spec | None, tuple[float, float, float, list[list[int]]]] = {}
            for entry, (obj, t, m, picks) in layers.items():
                for exit_spec, (o2, t2, m2, p2) in self._through(key, entry, w_time,
                                                                 lam).items():
                    cand = obj + o2
                    if exit_spec not in nxt or cand < nxt[exit_spec][0]:
                        nxt[exit_spec] = (cand, t + t2, m + m2, [*picks, p2])
            layers = nxt
        _obj, t, m, picks = min(layers.values(), key=lambda v: v[0])
        choice = [k for layer_picks in picks for k in layer_picks]
        return DpResult(choice=choice, time_s=t, memory_bytes=m)

    def solve_with_limit(self, memory_limit_bytes: float | None, iterations: int = 14
                         ) -> tuple[DpResult | None, DpResult]:
        """(best plan within the limit or None, the least-memory plan)."""
        best = self.solve()
        least = self.solve(w_time=1e-9, lam=1.0)
        if memory_limit_bytes is None or best.memory_bytes <= memory_limit_bytes:
            return best, least
        if least.memory_bytes > memory_limit_bytes:
            return None, least
        lo, hi = 0.0, 1.0
        found = least
        pool = [best, least]
        while True:
            r = self.solve(lam=hi)
            pool.append(r)
            if r.memory_bytes <= memory_limit_bytes or hi >= 1e6:
                break
            hi *= 4.0
        for _ in range(iterations):
            mid = (lo + hi) / 2
            r = self.solve(lam=mid)
            pool.append(r)
            if r.memory_bytes <= memory_limit_bytes:
                hi = mid
                if r.time_s < found.time_s:
                    found = r
            else:
                lo = mid
        lams = sorted({0.0, *np.geomspace(max(lo, hi * 1e-3), hi * 4, 24).tolist(), lo, hi})
        for rounding in (round, math.ceil):  # nearest first; ceil always fits
            packed = self._knapsack(lams, memory_limit_bytes, rounding=rounding)
            if packed is not None and packed.memory_bytes <= memory_limit_bytes:
                if packed.time_s < found.time_s:
                    found = packed
                break
        return self._mix(found, pool, memory_limit_bytes), least

    def _knapsack(self, lams: list[float], limit: float, buckets: int = 20000,
                  rounding: Callable[[float], int] = math.ceil) -> DpResult | None:
        """The memory-constrained outer DP: per layer, choose one of the segment's ways
        through (its menu: the inner DP's optimum for each λ in `lams`, per entry and exit
        layout), with memory as a DP dimension. Each layer's memory above the least of its
        menu is counted in steps of (limit − Σ those least) / `buckets`, rounded by
        `rounding` (math.ceil: the plan always fits). Exact over the menus up to that step:
        it mixes layer layouts the way one λ cannot."""
        menus: dict[tuple[int, Spec | None],
                    list[tuple[Spec | None, float, float, list[int]]]] = {}
        for key, entry in list(self._compiled):
            items: dict[tuple[Spec | None, tuple[int, ...]], tuple[Spec | None, float, float,
                                                                   list[int]]] = {}
            for lam in lams:
                for exit_spec, (_o, t, m, picks) in self._through(key, entry, 1.0,
                                                                  lam).items():
                    items.setdefault((exit_spec, tuple(picks)), (exit_spec, t, m, picks))
            menus[(key, entry)] = list(items.values())
        floor: dict[int, float] = {}
        for (key, _entry), items_of in menus.items():
            low = min(m for _e, _t, m, _p in items_of)
            floor[key] = min(floor.get(key, low), low)
        budget = limit - sum(floor[key] for key in self.layer_key)
        if budget < 0:
            return None
        g = max(budget, 1.0) / buckets
        cur: dict[Spec | None, np.ndarray] = {None: np.full(buckets + 1, np.inf)}
        cur[None][0] = 0.0
        backs: list[dict[Spec | None, tuple[np.ndarray, np.ndarray]]] = []
        descs: list[list[tuple[Spec | None, list[int], float]]] = []
        idx = np.arange(buckets + 1)
        for key in self.layer_key:
            nxt: dict[Spec | None, np.ndarray] = {}
            back: dict[Spec | None, tuple[np.ndarray, np.ndarray]] = {}
            desc: list[tuple[Spec | None, list[int], float]] = []
            for entry, arr in cur.items():
                for exit_spec, t, m, picks in menus.get((key, entry), []):
                    w = int(rounding((m - floor[key]) / g - 1e-9))
                    if w > buckets:
                        continue
                    cand = np.full(buckets + 1, np.inf)
                    cand[w:] = arr[:buckets + 1 - w] + t
                    if exit_spec not in nxt:
                        nxt[exit_spec] = np.full(buckets + 1, np.inf)
                        back[exit_spec] = (np.full(buckets + 1, -1), np.full(buckets + 1, -1))
                    better = cand < nxt[exit_spec]
                    nxt[exit_spec][better] = cand[better]
                    back[exit_spec][0][better] = len(desc)
                    back[exit_spec][1][better] = (idx - w)[better]
                    desc.append((entry, picks, m))
            cur = nxt
            backs.append(back)
            descs.append(desc)
        best: tuple[float, Spec | None, int] | None = None
        for spec, arr in cur.items():
            k = int(np.argmin(arr))
            if np.isfinite(arr[k]) and (best is None or arr[k] < best[0]):
                best = (float(arr[k]), spec, k)
        if best is None:
            return None
        _t, spec, bucket = best
        per_layer: list[list[int]] = []
        for layer in range(len(self.layer_key) - 1, -1, -1):
            d = int(backs[layer][spec][0][bucket])
            prev = int(backs[layer][spec][1][bucket])
            entry, picks, _m = descs[layer][d]
            per_layer.append(picks)
            spec, bucket = entry, prev
        choice = [k for picks in reversed(per_layer) for k in picks]
        t, m = self._cost(choice)
        return DpResult(choice=choice, time_s=t, memory_bytes=m)

    def _cost(self, choice: list[int]) -> tuple[float, float]:
        p = self.p
        t = sum(float(p.time_s[b][k]) for b, k in enumerate(choice))
        t += sum(float(e.cost[choice[e.src], choice[e.dst]]) for e in p.edges)
        return t, sum(float(p.memory_bytes[b][k]) for b, k in enumerate(choice))

    def _mix(self, start: DpResult, pool: list[DpResult], limit: float) -> DpResult:
        """Close the Lagrangian's duality gap: identical layers all take the same option at
        one λ, so memory moves in whole-model steps while the constrained optimum may lay out
        some layers one way and the rest another. Greedily take the move that saves the most
        time and still fits — one layer to its options in any plan the bisection met, or one
        block to any of its options — until none helps; costs are updated for the changed
        blocks and their edges only."""
        p = self.p
        touching: list[list[int]] = [[] for _ in self.layer_blocks]
        layer_of = {b: layer for layer, bs in enumerate(self.layer_blocks) for b in bs}
        for i, e in enumerate(p.edges):
            touching[layer_of[e.src]].append(i)
            if layer_of[e.dst] != layer_of[e.src]:
                touching[layer_of[e.dst]].append(i)
        edges_of: list[list[int]] = [[] for _ in p.blocks]
        for i, e in enumerate(p.edges):
            edges_of[e.src].append(i)
            edges_of[e.dst].append(i)
        cur = list(start.choice)
        cur_t, cur_m = start.time_s, start.memory_bytes
        seen: set[tuple[int, ...]] = set()
        cands = []
        for r in pool:
            if tuple(r.choice) not in seen:
                seen.add(tuple(r.choice))
                cands.append(r.choice)

        def delta(layer: int, new: list[int]) -> tuple[float, float]:
            dt = dm = 0.0
            for b in self.layer_blocks[layer]:
                dt += float(p.time_s[b][new[b]] - p.time_s[b][cur[b]])
                dm += float(p.memory_bytes[b][new[b]] - p.memory_bytes[b][cur[b]])
            for i in touching[layer]:
                e = p.edges[i]
                dt += float(e.cost[new[e.src], new[e.dst]] - e.cost[cur[e.src], cur[e.dst]])
            return dt, dm

        while True:
            move: tuple[float, float, list[int]] | None = None
            for cand in cands:
                for layer, blocks in enumerate(self.layer_blocks):
                    if all(cur[b] == cand[b] for b in blocks):
                        continue
                    trial = [*cur]
                    for b in blocks:
                        trial[b] = cand[b]
                    dt, dm = delta(layer, trial)
                    if dt < -1e-12 and cur_m + dm <= limit and (move is None or dt < move[0]):
                        move = (dt, dm, trial)
            for b, block in enumerate(p.blocks):  # single-block moves
                base_t = float(p.time_s[b][cur[b]])
                base_m = float(p.memory_bytes[b][cur[b]])
                for k in range(len(block.options)):
                    if k == cur[b]:
                        continue
                    dt = float(p.time_s[b][k]) - base_t
                    dm = float(p.memory_bytes[b][k]) - base_m
                    if cur_m + dm > limit:
                        continue
                    for i in edges_of[b]:
                        e = p.edges[i]
                        a_new = k if e.src == b else cur[e.src]
                        b_new = k if e.dst == b else cur[e.dst]
                        dt += float(e.cost[a_new, b_new] - e.cost[cur[e.src], cur[e.dst]])
                    if dt < -1e-12 and (move is None or dt < move[0]):
                        trial = [*cur]
                        trial[b] = k
                        move = (dt, dm, trial)
            if move is None:
                return DpResult(choice=cur, time_s=cur_t, memory_bytes=cur_m)
            cur_t, cur_m, cur = cur_t + move[0], cur_m + move[1], move[2]


__all__ = ["CfpSolver", "DpResult"]
