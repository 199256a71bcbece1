"""The block-level sharding problem both planners solve: option costs, memory, edge costs.

Per block option: its time (forward + backward + its own collectives + its weight-gradient
reduction, run alone), its memory per device (weights, gradients, optimizer states, saved
activations — additive over blocks because the lowering keeps every activation until the
backward). Per edge between blocks: the resharding collectives, forward and transposed
backward, for every pair of options. With `OraclePricing` a block option's time is measured by
the engine on the block's own Program (`program.lower_nodes`), once per distinct block (CFP's
hashing of repeated segments) — `oracle_evaluations` counts those runs; with
`AlphaBetaPricing` it is Alpa's formula.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from trainsim.hwmodels.cluster import Cluster
from trainsim.search.intraop.blocks import Block
from trainsim.search.intraop.costs import AlphaBetaPricing, OraclePricing
from trainsim.search.intraop.program import lower_nodes, program_times_s
from trainsim.workloads.sharding.graph import SpmdGraph
from trainsim.workloads.sharding.plan import (
    edge_collectives,
    grad_sync,
    kept_bytes,
    saved_bytes,
    static_bytes,
)
from trainsim.workloads.sharding.spec import (
    Spec,
    grad_spec_of_input,
    grad_spec_of_output,
    reshard,
)
from trainsim.workloads.sharding.strategies import Strategy


@dataclass(slots=True)
class Edge:
    """Tensors flowing from block `src` to block `dst`: cost[a, b] for options a, b."""

    src: int
    dst: int
    cost: np.ndarray


@dataclass(slots=True)
class Problem:
    """Everything the planners optimise over (module docstring)."""

    graph: SpmdGraph
    blocks: list[Block]
    time_s: list[np.ndarray]
    memory_bytes: list[np.ndarray]
    edges: list[Edge]
    block_of: list[int]
    oracle_evaluations: int = 0
    hidden_sync_time_s: list[np.ndarray] | None = None
    """With engine pricing: each option's time with its gradient reduction hidden behind
    later work (the engine's time until its last non-``dp`` task)."""
    edge_cache: dict[tuple[object, ...], float] = field(default_factory=dict)

    def option_count(self) -> int:
        """Σ options over blocks."""
        return sum(len(b.options) for b in self.blocks)

    def strategy_space(self) -> int:
        """Variables of the ILP: one per block option plus one per option pair of each edge."""
        return self.option_count() + sum(e.cost.size for e in self.edges)


def edge_cost_s(pricing: OraclePricing | AlphaBetaPricing, graph: SpmdGraph, src: Spec,
                dst: Strategy, dst_node: int, slot: int,
                cache: dict[tuple[object, ...], float]) -> float:
    """Forward + backward resharding time of one edge from a tensor laid out as `src`
    (cached on what it depends on)."""
    size = graph.nodes[dst_node].in_bytes[slot]
    key = (src, dst.in_specs[slot], dst.work_split, size)
    found = cache.get(key)
    if found is None:
        mesh = pricing.mesh
        want = dst.in_specs[slot]
        fwd = reshard(src, want, mesh, size)
        bwd = reshard(grad_spec_of_input(want, dst.work_split), grad_spec_of_output(src), mesh,
                      size)
        found = cache[key] = pricing.collectives_s(fwd) + pricing.collectives_s(bwd)
    return found


def formula_time_s(pricing: OraclePricing | AlphaBetaPricing, graph: SpmdGraph,
                   nodes: tuple[int, ...], option: tuple[Strategy, ...]) -> float:
    """A block option's time as the sum of its parts (no engine): passes, own collectives,
    internal edges and per-op gradient reductions. A tied LM head's block does not hold the
    embedding, so it reduces the tied weight over all of its batch-split axes, and the axes
    both split are counted twice (once here, once in the embedding's block): the search's
    estimate is one V×h reduction high there; the engine's time of the whole plan
    (`lower_plan`) reduces it once."""
    total = 0.0
    where = {n: k for k, n in enumerate(nodes)}
    by_node = dict(zip(nodes, option, strict=True))
    for n, st in zip(nodes, option, strict=True):
        t = pricing.op_passes(graph, n, st)
        total += t.fwd_s + t.bwd_s + pricing.collectives_s(list(st.fwd_comm))
        total += pricing.collectives_s(grad_sync(graph, by_node, n, pricing.mesh, pricing.dtype))
        for slot, src in enumerate(graph.nodes[n].srcs):
            if src in where:
                fwd, bwd = edge_collectives(graph, pricing.mesh, option[where[src]], st, n, slot)
                total += pricing.collectives_s(fwd) + pricing.collectives_s(bwd)
    return total


def build_problem(graph: SpmdGraph, blocks: list[Block], cluster: Cluster,
                  pricing: OraclePricing | AlphaBetaPricing, *, engine: bool,
                  runs: dict[tuple[object, ...], tuple[float, float]] | None = None) -> Problem:
    """Costs of every block option and every inter-block edge.

    `engine`: measure block options on the engine (CFP) instead of summing formula parts.
    Blocks with equal keys (repeated layers) are priced once and share the numbers; `runs`
    keeps engine results across problems of the same graph (a second problem with recompute
    options re-measures only those). A recomputing option holds only the block's inputs from
    outside it (`plan.kept_bytes`) and runs its forward twice.
    """
    runs = {} if runs is None else runs
    block_of = [0] * len(graph.nodes)
    for b in blocks:
        for n in b.nodes:
            block_of[n] = b.index
    evaluated: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    evaluations = 0
    times, mems, hidden = [], [], []
    dtype = pricing.dtype
    for b in blocks:
        found = evaluated.get(b.key)
        if found is None:
            t = np.zeros(len(b.options))
            h = np.zeros(len(b.options))
            m = np.zeros(len(b.options))
            group: defaultdict[int, int] = defaultdict(lambda: -1, dict.fromkeys(b.nodes, 0))
            for k, opt in enumerate(b.options):
                again = b.recomputes(k)
                m[k] = sum(static_bytes(graph, st, n, dtype)
                           + (kept_bytes(graph, st, n, group, pricing.mesh) if again
                              else saved_bytes(graph, st, n))
                           for n, st in zip(b.nodes, opt, strict=True))
                if engine:
                    assert isinstance(pricing, OraclePricing)
                    run_key = (b.key, tuple(s.roles for s in opt), again)
                    if run_key not in runs:
                        groups = [group[n] for n in range(len(graph.nodes))] if again else None
                        prog = lower_nodes(graph, dict(zip(b.nodes, opt, strict=True)), cluster,
                                           pricing, optimizer=False, recompute_group=groups)
                        runs[run_key] = program_times_s(prog)
                        evaluations += 1
                    t[k], h[k] = runs[run_key]
                else:
                    t[k] = h[k] = formula_time_s(pricing, graph, b.nodes, opt)
                    if again:
                        extra = sum(pricing.op_passes(graph, n, st).fwd_s
                                    for n, st in zip(b.nodes, opt, strict=True))
                        t[k] += extra
                        h[k] += extra
            found = evaluated[b.key] = (t, m, h)
        times.append(found[0])
        mems.append(found[1])
        hidden.append(found[2])
    edges: dict[tuple[int, int], np.ndarray] = {}
    cache: dict[tuple[object, ...], float] = {}
    matrix_cache: dict[tuple[object, ...], np.ndarray] = {}
    for node in graph.nodes:
        bv = block_of[node.index]
        for slot, src in enumerate(node.srcs):
            bu = block_of[src]
            if bu == bv:
                continue
            su = blocks[bu].nodes.index(src)
            sv = blocks[bv].nodes.index(node.index)
            mkey = (blocks[bu].key, su, blocks[bv].key, sv, slot)
            mat = matrix_cache.get(mkey)
            if mat is None:
                mat = np.array([[edge_cost_s(pricing, graph, a[su].out_spec, b[sv], node.index, slot,
                                             cache)
                                 for b in blocks[bv].options] for a in blocks[bu].options])
                matrix_cache[mkey] = mat
            key = (bu, bv)
            edges[key] = edges[key] + mat if key in edges else mat.copy()
    return Problem(graph=graph, blocks=blocks, time_s=times, memory_bytes=mems,
                   edges=[Edge(src=u, dst=v, cost=c) for (u, v), c in sorted(edges.items())],
                   block_of=block_of, oracle_evaluations=evaluations, edge_cache=cache,
                   hidden_sync_time_s=hidden if engine else None)


def plan_cost(problem: Problem, choice: list[int]) -> tuple[float, float]:
    """(time, memory) of one option per block under the problem's costs."""
    t = sum(float(problem.time_s[b][k]) for b, k in enumerate(choice))
    t += sum(float(e.cost[choice[e.src], choice[e.dst]]) for e in problem.edges)
    m = sum(float(problem.memory_bytes[b][k]) for b, k in enumerate(choice))
    return t, m


__all__ = ["Edge", "Problem", "build_problem", "edge_cost_s", "formula_time_s", "plan_cost"]
